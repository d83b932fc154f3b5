"""Start-up's heap is frozen once per process by the entry points (bootstrap.settle_heap)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sendqueue.cli import app


def test_settle_heap_freezes_start_up_once_per_process() -> None:
    # In a child: freezing is for the whole process, and this one is pytest's.
    code = (
        "import gc\n"
        "from sendqueue.bootstrap import bootstrap, settle_heap\n"
        "assert gc.get_freeze_count() == 0\n"
        "settle_heap()\n"
        "first = gc.get_freeze_count()\n"
        "junk = [[i] for i in range(1000)]\n"
        "settle_heap()\n"
        "print(first, gc.get_freeze_count(), gc.get_threshold()[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    first, second, young = map(int, done.stdout.split())
    assert first > 10_000  # the imports' objects
    assert second == first  # the second call neither collects nor freezes again
    assert young == 10_000


def test_every_cli_command_settles_the_heap_once_its_container_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr("sendqueue.cli.common.settle_heap", lambda: calls.append("settled"))
    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("SENDQUEUE_SCHEDULER_URL", f"sqlite:///{tmp_path / 'scheduler.db'}")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["sender", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert calls == ["settled"]
