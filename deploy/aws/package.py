"""Build the Lambda deployment bundle: ``build/aws/`` and ``build/sendqueue-aws.zip``.

``make aws-package`` runs this. The bundle is sendqueue's package (copied from ``src/``, package
data included) plus the runtime dependencies of ``pyproject.toml``, installed by pip for the
Lambda runtime's platform (manylinux2014 x86_64 wheels for the template's Python version), not
for this machine. Left out:

- the ``dev`` extra and the other optional extras (PostgreSQL, procrastinate, bench): the
  functions use none of them; the build fails if any of their packages is in the bundle;
- the ``aws`` extra (boto3, and with it botocore and s3transfer), unless ``--with-boto3``: every
  Lambda Python runtime ships boto3, and botocore alone is most of a bundle that carries it. Pass
  ``--with-boto3`` to pin the SDK version yourself instead of taking the runtime's.

Dependencies come from PyPI (pip's usual index); nothing else is downloaded.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The template's Runtime (python3.12) and Architectures (x86_64); tests/aws checks they agree.
PYTHON_VERSION = "3.12"
PLATFORM = "manylinux2014_x86_64"
#: Lambda's limit for a function's code, unzipped (bytes).
UNZIPPED_LIMIT = 250 * 1024 * 1024
#: Always provided by the Lambda runtime, so never needed in the bundle without --with-boto3.
SDK = frozenset({"boto3", "botocore", "s3transfer", "jmespath"})


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """``"moto[server]>=5.0; python_version < '4'"`` -> ``"moto"``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"pyproject.toml: cannot read the requirement {requirement!r}")
    return canonical(match.group(1))


def _project(pyproject: Path) -> dict[str, object]:
    with pyproject.open("rb") as f:
        project = tomllib.load(f)["project"]
    assert isinstance(project, dict)
    return project


def runtime_requirements(pyproject: Path, *, with_boto3: bool) -> list[str]:
    """What pip installs into the bundle: the core dependencies, plus the aws extra if asked."""
    project = _project(pyproject)
    core = project["dependencies"]
    assert isinstance(core, list)
    extras = project.get("optional-dependencies", {})
    assert isinstance(extras, dict)
    return [*core, *(extras["aws"] if with_boto3 else [])]


def forbidden(pyproject: Path, *, with_boto3: bool) -> set[str]:
    """Distributions that must not be in the bundle: every optional extra's direct requirements
    (dev first of all), minus what the core dependencies themselves require, and the SDK unless
    it is bundled on purpose."""
    project = _project(pyproject)
    core = project["dependencies"]
    assert isinstance(core, list)
    extras = project.get("optional-dependencies", {})
    assert isinstance(extras, dict)
    allowed = {requirement_name(r) for r in runtime_requirements(pyproject, with_boto3=with_boto3)}
    names = {
        requirement_name(r)
        for requirements in extras.values()
        for r in requirements
        if requirement_name(r) != canonical(str(project["name"]))
    }
    if not with_boto3:
        names |= SDK
    return names - allowed


def installed(bundle: Path) -> set[str]:
    """The distributions pip installed into ``bundle`` (one ``*.dist-info`` each)."""
    return {
        canonical(path.name[: -len(".dist-info")].rsplit("-", 1)[0])
        for path in bundle.glob("*.dist-info")
    }


def check_bundle(bundle: Path, refused: Iterable[str]) -> None:
    """Raise if a refused distribution is in ``bundle`` or its size exceeds Lambda's limit."""
    present = sorted(installed(bundle) & {canonical(n) for n in refused})
    if present:
        raise SystemExit(
            f"{bundle}: dev/optional packages in the Lambda bundle: {', '.join(present)} "
            "(something in the runtime dependencies pulls them in)"
        )
    if not (bundle / "sendqueue" / "__init__.py").is_file():
        raise SystemExit(f"{bundle}: sendqueue itself is missing from the bundle")
    size = tree_size(bundle)
    if size > UNZIPPED_LIMIT:
        raise SystemExit(
            f"{bundle}: {size / 2**20:.1f} MiB unzipped, over Lambda's 250 MiB limit for code"
        )


def tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def pip_command(
    requirements: list[str], target: Path, *, python_version: str, platform: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-warn-conflicts",  # with this venv's packages, which are not in the bundle
        "--no-compile",  # the runtime compiles on import; .pyc files from here would not match
        "--target",
        str(target),
        "--platform",
        platform,
        "--implementation",
        "cp",
        "--python-version",
        python_version,
        "--only-binary=:all:",
        *requirements,
    ]


def write_zip(bundle: Path, archive: Path) -> None:
    """Every file of ``bundle`` at the archive's root, in a stable order."""
    archive.unlink(missing_ok=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(path.relative_to(bundle).as_posix(), (1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16  # readable by the runtime's user
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())


def build(
    out: Path, archive: Path, *, with_boto3: bool, python_version: str, platform: str
) -> None:
    pyproject = ROOT / "pyproject.toml"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    requirements = runtime_requirements(pyproject, with_boto3=with_boto3)
    subprocess.run(
        pip_command(requirements, out, python_version=python_version, platform=platform),
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    # Console scripts (typer, uvicorn, ...) are useless in a function.
    shutil.rmtree(out / "bin", ignore_errors=True)
    shutil.copytree(
        ROOT / "src" / "sendqueue",
        out / "sendqueue",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    check_bundle(out, forbidden(pyproject, with_boto3=with_boto3))
    write_zip(out, archive)
    print(
        f"{out}: {tree_size(out) / 2**20:.1f} MiB unzipped, {len(installed(out))} distributions"
        f"{' (boto3 bundled)' if with_boto3 else ' (boto3 from the Lambda runtime)'}\n"
        f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "aws")
    parser.add_argument("--zip", type=Path, default=ROOT / "build" / "sendqueue-aws.zip")
    parser.add_argument("--python-version", default=PYTHON_VERSION)
    parser.add_argument("--platform", default=PLATFORM)
    parser.add_argument(
        "--with-boto3", action="store_true", help="bundle the aws extra instead of the runtime's"
    )
    args = parser.parse_args(argv)
    build(
        args.out,
        args.zip,
        with_boto3=args.with_boto3,
        python_version=args.python_version,
        platform=args.platform,
    )


if __name__ == "__main__":
    main()
