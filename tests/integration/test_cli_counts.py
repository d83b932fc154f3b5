"""Counts the CLI prints are in words, singular for one: ``reconcile`` after losing one or
two schedules (it printed "repaired 1 things"), and the tables' titles."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sendqueue.bootstrap import bootstrap
from sendqueue.cli import app
from sendqueue.domain.models import expected_schedule_name
from sendqueue.settings import Settings


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("SENDQUEUE_SCHEDULER_URL", f"sqlite:///{tmp_path / 'scheduler.db'}")
    monkeypatch.setenv("SENDQUEUE_MAILER", f"maildir:{tmp_path / 'outbox'}")
    return CliRunner()


def run(cli: CliRunner, *args: str) -> tuple[int, str, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def provisioned(cli: CliRunner, tmp_path: Path, recipients: int) -> str:
    rows = "".join(f"r{i}@example.com,R{i}\n" for i in range(recipients))
    (tmp_path / "r.csv").write_text("email,name\n" + rows, encoding="utf-8")
    (tmp_path / "body.txt").write_text("Hi {{ name }}", encoding="utf-8")
    code, out, err = run(
        cli, "campaign", "create", "--name", "Counts", "--recipients", "r.csv",
        "--subject", "Hi", "--body-file", "body.txt", "--start", "2030-01-07T10:00", "--json",
    )  # fmt: skip
    assert code == 0, err
    cid: str = json.loads(out)["id"]
    code, out, err = run(cli, "campaign", "provision", cid)
    assert code == 0, err
    assert says(out, recipients, "task") and says(out, recipients, "schedule")
    return cid


def plural_text(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def says(text: str, count: int, word: str) -> bool:
    """``text`` counts ``count`` ``word`` in words, not "1 words" or "1 word(s)"."""
    return re.search(rf"(?<!\d){re.escape(plural_text(count, word))}(?![\w(])", text) is not None


@pytest.mark.parametrize(
    ("lost", "checked", "repairs"),
    [
        (1, "checked 1 campaign and 1 schedule", "1 repair: 1 missing schedule created"),
        (2, "checked 1 campaign and 0 schedules", "2 repairs: 2 missing schedules created"),
    ],
)
def test_reconcile_says_its_repairs_in_words(
    cli: CliRunner,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    lost: int,
    checked: str,
    repairs: str,
) -> None:
    cid = provisioned(cli, tmp_path, 2)
    c = bootstrap(Settings())
    try:
        for task in c.store.list_tasks(cid)[:lost]:
            c.scheduler.delete(expected_schedule_name(task))
    finally:
        c.close()

    code, out, err = run(cli, "reconcile")
    assert code == 0, err
    assert out.splitlines() == [checked, repairs]
    assert f"reconciler made {repairs}" in caplog.messages
    assert "things" not in out + err + " ".join(caplog.messages)

    code, out, _ = run(cli, "reconcile")  # nothing left to repair
    assert out.splitlines() == ["checked 1 campaign and 2 schedules", "no repairs"]


@pytest.mark.parametrize("recipients", [1, 2])
def test_the_tables_count_in_words(cli: CliRunner, tmp_path: Path, recipients: int) -> None:
    cid = provisioned(cli, tmp_path, recipients)
    assert says(run(cli, "campaign", "list")[1], 1, "campaign")
    assert says(run(cli, "campaign", "tasks", cid)[1], recipients, "email")
    code, out, _ = run(
        cli, "plan", "--count", str(recipients), "--timezone", "UTC", "--start", "2030-01-07T08:00"
    )
    assert code == 0 and says(out, recipients, "send") and says(out, 1, "sending day")
    assert "(s)" not in out
