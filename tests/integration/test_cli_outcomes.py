"""Issue 14 on the command line (SQLite files in a temp dir): ``campaign create``'s
``--stop-on-reply`` and ``--[no-]unsubscribe-footer``, shown by ``campaign show``; outcomes in
``campaign tasks``, ``task show``, ``campaign show`` and ``campaign list``."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.sql import open_store
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from tests.integration.test_cli import cli, run

__all__ = ["cli"]  # the fixture, shared with test_cli

CSV = "email,name,subject,body\nada@example.com,Ada,S,B\ngrace@example.com,Grace,S,B\n"


def _create(cli: CliRunner, tmp_path: Path, *options: str) -> tuple[int, str, str]:
    (tmp_path / "p.csv").write_text(CSV, encoding="utf-8")
    return run(
        cli, "campaign", "create", "--name", "Launch", "--recipients", "p.csv",
        "--from", "news@example.com", "--start", "2030-01-07T09:00", *options,
    )  # fmt: skip


def test_create_carries_the_options_and_show_prints_them(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = _create(
        cli, tmp_path, "--stop-on-reply", "campaign", "--unsubscribe-footer", "--json"
    )
    assert code == 0, err
    created = json.loads(out)
    assert (created["stop_on_reply"], created["unsubscribe_footer"]) == ("campaign", True)
    code, out, _ = run(cli, "campaign", "show", created["id"], "--json")
    shown = json.loads(out)
    assert (shown["stop_on_reply"], shown["unsubscribe_footer"]) == ("campaign", True)
    assert shown["outcomes"] == {o.value: 0 for o in TaskOutcome}
    code, out, _ = run(cli, "campaign", "show", created["id"])
    assert code == 0
    assert "stop on reply: campaign  unsubscribe footer: on" in out
    assert "outcomes: accepted: 0  bounced: 0" in out


def test_the_defaults_are_sender_and_no_footer(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = _create(cli, tmp_path, "--json")
    assert code == 0, err
    created = json.loads(out)
    assert (created["stop_on_reply"], created["unsubscribe_footer"]) == ("sender", False)
    code, out, err = _create(cli, tmp_path, "--no-unsubscribe-footer", "--stop-on-reply", "OFF")
    assert code == 0, err
    assert "stop on reply: off  unsubscribe footer: off" in out


@pytest.mark.parametrize("value", ["always", "", "sender,campaign"])
def test_a_bad_stop_on_reply_names_the_field_and_creates_nothing(
    cli: CliRunner, tmp_path: Path, value: str
) -> None:
    code, out, err = _create(cli, tmp_path, "--stop-on-reply", value)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stop_on_reply:"), err
    assert "sender, campaign, off" in err
    code, out, _ = run(cli, "campaign", "list", "--json")
    assert code == 0 and json.loads(out) == []


def test_outcomes_show_in_tasks_task_show_campaign_show_and_list(
    cli: CliRunner, tmp_path: Path
) -> None:
    code, out, err = _create(cli, tmp_path, "--json")
    assert code == 0, err
    cid = json.loads(out)["id"]
    assert run(cli, "campaign", "provision", cid)[0] == 0
    # both emails sent (as the worker would), then one bounces
    store = open_store(os.environ["SENDQUEUE_DATABASE_URL"])
    now = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
    try:
        for position in (0, 1):
            task_id = f"{cid}-{position}"
            assert store.transition(task_id, TaskState.PENDING, TaskState.RUNNING, at=now)
            assert store.transition(
                task_id, TaskState.RUNNING, TaskState.FINISHED, at=now, changes={"sent_at": now}
            )
        assert store.set_outcome(
            f"{cid}-0",
            TaskOutcome.BOUNCED,
            detail="5.1.1 smtp; 550 user unknown",
            at=now + timedelta(minutes=2),
        )
    finally:
        store.close()

    code, out, _ = run(cli, "campaign", "tasks", cid, "--json")
    rows = json.loads(out)
    assert [(t["state"], t["outcome"]) for t in rows] == [
        ("Finished", "bounced"),
        ("Finished", None),
    ]
    assert rows[0]["outcome_detail"] == "5.1.1 smtp; 550 user unknown"
    assert rows[0]["outcome_at"] == "2030-01-07T08:02:00Z"
    code, out, _ = run(cli, "campaign", "tasks", cid)
    assert code == 0 and "outcome" in out and "bounced" in out

    code, out, _ = run(cli, "task", "show", f"{cid}-0", "--json")
    assert code == 0
    shown = json.loads(out)
    assert (shown["id"], shown["outcome"], shown["subject"]) == (f"{cid}-0", "bounced", "S")
    code, out, _ = run(cli, "task", "show", f"{cid}-0")
    assert code == 0
    assert "outcome: bounced (5.1.1 smtp; 550 user unknown) at 2030-01-07T08:02:00Z" in out
    code, _, err = run(cli, "task", "show", f"{cid}-9")
    assert code == 1 and "not found" in err

    code, out, _ = run(cli, "campaign", "show", cid, "--json")
    assert json.loads(out)["outcomes"] == {
        "accepted": 0, "bounced": 1, "complained": 0, "replied": 0, "unsubscribed": 0,
    }  # fmt: skip
    code, out, _ = run(cli, "campaign", "show", cid)
    assert "outcomes: accepted: 0  bounced: 1  complained: 0" in out
    code, out, _ = run(cli, "campaign", "list", "--json")
    assert json.loads(out)[0]["outcomes"]["bounced"] == 1
    code, out, _ = run(cli, "campaign", "list")
    assert code == 0 and "bounced" in out and "unsubscri" in out
