"""The Lambda bundle's build rules (deploy/aws/package.py, run by `make aws-package`).

The build itself downloads wheels from PyPI, so it is not run here; these tests cover what it
decides: what pip is asked to install, what must never be in the bundle, and the check that
refuses a bundle with dev packages in it.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from cfnlint.decode import decode_str

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sendqueue_aws_package", ROOT / "deploy/aws/package.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


package = _load()


def _names(requirements: list[str]) -> set[str]:
    return {package.requirement_name(r) for r in requirements}


def test_the_bundle_installs_the_core_dependencies_and_no_extra() -> None:
    names = _names(package.runtime_requirements(PYPROJECT, with_boto3=False))
    assert {"pydantic", "sqlalchemy", "tzdata"} <= names
    assert not names & {"boto3", "moto", "pytest", "psycopg", "procrastinate", "cfn-lint"}


def test_with_boto3_adds_only_the_aws_extra() -> None:
    without = _names(package.runtime_requirements(PYPROJECT, with_boto3=False))
    with_sdk = _names(package.runtime_requirements(PYPROJECT, with_boto3=True))
    assert with_sdk - without == {"boto3"}


def test_dev_and_optional_packages_are_refused() -> None:
    refused = package.forbidden(PYPROJECT, with_boto3=False)
    # dev tools, the other extras, and the SDK the runtime provides
    assert {"pytest", "moto", "mypy", "cfn-lint", "aws-sam-translator", "ruff"} <= refused
    assert {"psycopg", "procrastinate", "apscheduler"} <= refused
    assert {"boto3", "botocore"} <= refused
    # never the package itself or what it needs
    core = _names(package.runtime_requirements(PYPROJECT, with_boto3=False))
    assert not refused & (core | {"sendqueue"})
    assert "boto3" not in package.forbidden(PYPROJECT, with_boto3=True)


def _fake_bundle(root: Path, *distributions: str) -> Path:
    (root / "sendqueue").mkdir(parents=True)
    (root / "sendqueue" / "__init__.py").write_text("")
    for dist in distributions:
        (root / f"{dist}.dist-info").mkdir()
    return root


def test_check_bundle_names_a_dev_package_that_slipped_in(tmp_path: Path) -> None:
    bundle = _fake_bundle(tmp_path / "aws", "pydantic-2.14.4", "pytest_timeout-2.3.1")
    refused = package.forbidden(PYPROJECT, with_boto3=False)
    with pytest.raises(SystemExit, match="pytest-timeout"):
        package.check_bundle(bundle, refused)


def test_check_bundle_accepts_runtime_packages_and_wants_sendqueue(tmp_path: Path) -> None:
    refused = package.forbidden(PYPROJECT, with_boto3=False)
    package.check_bundle(
        _fake_bundle(tmp_path / "ok", "pydantic-2.14.4", "SQLAlchemy-2.1.9"), refused
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="sendqueue itself is missing"):
        package.check_bundle(empty, refused)


def test_pip_is_asked_for_lambda_wheels_only(tmp_path: Path) -> None:
    command = package.pip_command(
        ["pydantic>=2.7"], tmp_path, python_version="3.12", platform="manylinux2014_x86_64"
    )
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert "--only-binary=:all:" in command
    assert command[command.index("--platform") + 1] == "manylinux2014_x86_64"
    assert command[command.index("--python-version") + 1] == "3.12"
    assert command[command.index("--target") + 1] == str(tmp_path)
    assert command[-1] == "pydantic>=2.7"


def test_the_zip_holds_the_tree_at_its_root(tmp_path: Path) -> None:
    bundle = _fake_bundle(tmp_path / "aws", "pydantic-2.14.4")
    (bundle / "sendqueue" / "lambda_handlers.py").write_text("x = 1\n")
    archive = tmp_path / "b.zip"
    package.write_zip(bundle, archive)
    with zipfile.ZipFile(archive) as z:
        assert set(z.namelist()) == {"sendqueue/__init__.py", "sendqueue/lambda_handlers.py"}
        assert z.read("sendqueue/lambda_handlers.py") == b"x = 1\n"
    first = archive.read_bytes()
    package.write_zip(bundle, archive)
    assert archive.read_bytes() == first  # the same tree zips to the same bytes


def test_the_bundle_targets_the_templates_runtime() -> None:
    template, errors = decode_str((ROOT / "deploy/aws/template.yaml").read_text(encoding="utf-8"))
    assert not errors and template is not None
    function = template["Globals"]["Function"]
    assert function["Runtime"] == f"python{package.PYTHON_VERSION}"
    assert list(function["Architectures"]) == ["x86_64"]
    assert package.PLATFORM.endswith("_x86_64")
    # CodeUri is the directory the build writes, relative to the template
    code = (ROOT / "deploy/aws" / function["CodeUri"]).resolve()
    assert code == (ROOT / "build" / "aws").resolve()
