"""The README's quick start runs as written: the marked block, verbatim, under bash with
``set -euo pipefail``, the venv's commands first on PATH and no ``SENDQUEUE_*`` variable set,
in an empty directory. It must exit 0 and leave what it promises: the campaign, active, with
one Pending task and one schedule per recipient, and nothing sent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sendqueue.bootstrap import bootstrap
from sendqueue.domain.models import schedule_group
from sendqueue.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = (
    "<!-- quick start: tests/integration/test_readme_quickstart.py runs the next block verbatim -->"
)
_BLOCK = re.compile(r"\A\s*```sh\n(?P<body>.*?)^```\s*$", re.DOTALL | re.MULTILINE)

pytestmark = pytest.mark.slow


def quick_start(readme: str) -> str:
    """The fenced ``sh`` block right after the one marker; its first line is ``# quick start``."""
    parts = readme.split(MARKER)
    assert len(parts) == 2, f"README.md must hold the marker exactly once: {MARKER}"
    block = _BLOCK.match(parts[1])
    assert block, "the marker must be followed by a fenced sh block"
    body = block.group("body")
    assert body.startswith("# quick start\n"), "the block's first line must be '# quick start'"
    return body


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    # The venv this suite runs in: its `sendqueue` and `python`, as after `. .venv/bin/activate`.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    script = quick_start(README.read_text(encoding="utf-8"))
    env = _env()
    run = _run(["bash", "-c", "set -euo pipefail\n" + script], tmp_path, env)
    assert run.returncode == 0, (
        f"the README's quick start failed (exit {run.returncode}):\n"
        f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    )

    work = tmp_path / "quickstart"
    listed = _run(["sendqueue", "campaign", "list", "--json"], work, env)
    assert listed.returncode == 0, listed.stderr
    campaigns: list[dict[str, Any]] = json.loads(listed.stdout)
    assert [c["name"] for c in campaigns] == ["December news"]
    campaign = campaigns[0]
    assert campaign["state"] == "active"
    assert campaign["counts"]["Pending"] == 2
    assert campaign["policy"]["timezone"] == "America/New_York"
    assert campaign["policy"]["windows"] == ["09:00-12:00", "13:00-17:00"]

    first = _run(["sendqueue", "task", "show", f"{campaign['id']}-0", "--json"], work, env)
    assert first.returncode == 0, first.stderr
    task = json.loads(first.stdout)
    assert (task["email"], task["subject"]) == ("ada@example.com", "News for Analytical Engines")
    assert not (work / "outbox" / "new").exists() or not any((work / "outbox" / "new").iterdir())

    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{work / 'sendqueue.db'}",
        scheduler_url=f"sqlite:///{work / 'sendqueue-scheduler.db'}",
        mailer=f"maildir:{work / 'outbox'}",
    )
    container = bootstrap(settings)
    try:
        schedules = container.scheduler.list(schedule_group(campaign["id"]))
    finally:
        container.close()
    assert sorted(s.payload["task_id"] for s in schedules) == [
        f"{campaign['id']}-0",
        f"{campaign['id']}-1",
    ]


def test_the_quick_start_is_found_exactly() -> None:
    text = f"intro\n{MARKER}\n```sh\n# quick start\necho one\n```\n\n```sh\necho two\n```\n"
    assert quick_start(text) == "# quick start\necho one\n"
    with pytest.raises(AssertionError, match="exactly once"):
        quick_start(text + MARKER)
    with pytest.raises(AssertionError, match="first line"):
        quick_start(f"{MARKER}\n```sh\necho one\n```\n")
