"""Sequences on the command line (Typer's CliRunner, SQLite files in a temp dir):
``campaign create --steps`` (every step in the file, or step 1 from --subject/--body-file and
the later ones in the file), ``campaign show`` with its steps and their counts, ``campaign
tasks --step``; every bad input exits 2 naming its field and stores nothing."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.sql import open_store
from sendqueue.cli import app
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import task_id
from sendqueue.domain.steps import Delay, DelayUnit, Step

FULL = """\
steps:
  - subject: "Hello {{ name }}"
    body_file: first.txt
  - after: 3d
    body: "Hi {{ name }}, did you see it?"
  - after: 4h
    subject: Last call
    body: "Bye {{ name }}"
    new_thread: true
"""

LATER = """\
- after: 2d
  body: "Again, {{ name }}"
- after: 30m
  body: "Once more"
"""


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("SENDQUEUE_SCHEDULER_URL", f"sqlite:///{tmp_path / 'scheduler.db'}")
    monkeypatch.setenv("SENDQUEUE_MAILER", f"maildir:{tmp_path / 'outbox'}")
    monkeypatch.setenv("SENDQUEUE_DEFAULT_TIMEZONE", "UTC")
    (tmp_path / "r.csv").write_text("email,name\na@example.com,Ada\nb@example.com,Bob\n")
    (tmp_path / "first.txt").write_text("Dear {{ name }}")
    (tmp_path / "steps.yaml").write_text(FULL)
    (tmp_path / "later.yaml").write_text(LATER)
    return CliRunner()


def run(cli: CliRunner, *args: str) -> tuple[int, str, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def run_json(cli: CliRunner, *args: str) -> Any:
    code, out, err = run(cli, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def create(cli: CliRunner, *extra: str) -> tuple[int, str, str]:
    return run(cli, "campaign", "create", "--name", "Seq", "--recipients", "r.csv",
               "--weekdays", "mon-sun", "--window", "00:00-24:00", *extra)  # fmt: skip


def stored_steps(tmp_path: Path, cid: str) -> tuple[Step, ...]:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        return store.get_campaign(cid).steps
    finally:
        store.close()


def test_create_with_every_step_in_the_file(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = create(cli, "--steps", "steps.yaml", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [(s["number"], s["after"], s["subject"], s["new_thread"]) for s in data["steps"]] == [
        (1, None, "Hello {{ name }}", False),
        (2, "3d", "Re: Hello {{ name }}", False),
        (3, "4h", "Last call", True),
    ]
    assert data["import"]["rows"] == 2
    assert stored_steps(tmp_path, data["id"]) == (
        Step(1, "Hello {{ name }}", "Dear {{ name }}", None, None),
        Step(2, None, "Hi {{ name }}, did you see it?", None, Delay(3, DelayUnit.DAYS)),
        Step(3, "Last call", "Bye {{ name }}", None, Delay(4, DelayUnit.HOURS), True),
    )


def test_create_with_step_1_from_the_options_and_the_later_steps_in_the_file(
    cli: CliRunner, tmp_path: Path
) -> None:
    code, out, err = create(
        cli, "--subject", "Hi {{ name }}", "--body-file", "first.txt", "--steps", "later.yaml"
    )
    assert code == 0, err
    assert "steps" in out and "Re: Hi {{ name }}" in out and "30m" in out
    cid = run_json(cli, "campaign", "list")[0]["id"]
    assert stored_steps(tmp_path, cid) == (
        Step(1, "Hi {{ name }}", "Dear {{ name }}", None, None),
        Step(2, None, "Again, {{ name }}", None, Delay(2, DelayUnit.DAYS)),
        Step(3, None, "Once more", None, Delay(30, DelayUnit.MINUTES)),
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--subject", "s", "--body-file", "first.txt", "--steps", "steps.yaml"], "steps"),
        (["--subject", "s", "--steps", "later.yaml"], "body_file"),
        (["--body-file", "first.txt", "--steps", "later.yaml"], "subject"),
        (["--html-file", "first.txt", "--steps", "steps.yaml"], "subject"),
        (["--subject", " ", "--body-file", "first.txt", "--steps", "later.yaml"], "subject"),
        (["--steps", "later.yaml"], "steps[1].subject"),
        (["--steps", "missing.yaml"], "steps_file"),
        (["--subject", "s", "--body-file", "first.txt", "--steps", "bad_after.yaml"],
         "steps[3].after"),
        (["--steps", "bad_template.yaml"], "steps[2].body"),
    ],
)  # fmt: skip
def test_bad_steps_exit_2_naming_the_field_and_store_nothing(
    cli: CliRunner, tmp_path: Path, args: list[str], field: str
) -> None:
    (tmp_path / "bad_after.yaml").write_text(LATER.replace("30m", "30 minutes"))
    (tmp_path / "bad_template.yaml").write_text(FULL.replace("did you see it?", "{{ oops"))
    code, out, err = create(cli, *args)
    assert code == 2, (out, err)
    assert err.startswith(f"error: {field}:"), err
    assert run_json(cli, "campaign", "list") == []


def _send_some(tmp_path: Path, cid: str) -> None:
    """Step 1 of Ada sent and replied to, Bob's sent; Bob's step 2 made (Pending)."""
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        for position, outcome in ((0, TaskOutcome.REPLIED), (1, TaskOutcome.ACCEPTED)):
            task = store.get_task(task_id(cid, position))
            assert task is not None
            at = task.send_at
            assert store.transition(task.id, TaskState.PENDING, TaskState.RUNNING, at=at)
            changes: Any = {"sent_at": at, "message_id": f"<{position}@x>", "outcome": outcome}
            assert store.transition(task.id, TaskState.RUNNING, TaskState.FINISHED, at=at,
                                    changes=changes)  # fmt: skip
        later = store.get_task(task_id(cid, 1))
        assert later is not None
        follow_up = replace(
            later, id=task_id(cid, 1, 2), step=2, state=TaskState.PENDING, sent_at=None,
            send_at=later.send_at + timedelta(days=2), message_id=None, outcome=None,
        )  # fmt: skip
        assert store.insert_tasks([follow_up], at=later.send_at) == 1
    finally:
        store.close()


def test_show_lists_the_steps_with_their_counts_and_tasks_filter_by_step(
    cli: CliRunner, tmp_path: Path
) -> None:
    code, _, err = create(cli, "--steps", "steps.yaml")
    assert code == 0, err
    cid = run_json(cli, "campaign", "list")[0]["id"]
    assert run(cli, "campaign", "provision", cid)[0] == 0
    _send_some(tmp_path, cid)
    data = run_json(cli, "campaign", "show", cid)
    per_step = [(s["number"], s["counts"]["Finished"], s["counts"]["Pending"],
                 s["outcomes"]["replied"]) for s in data["steps"]]  # fmt: skip
    assert per_step == [(1, 2, 0, 1), (2, 0, 1, 0), (3, 0, 0, 0)]
    code, out, _ = run(cli, "campaign", "show", cid)
    assert code == 0
    # the table's cells, row by row
    rows = [[c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in out.splitlines()]
    assert ["step", "after", "subject", "thread", "pending", "sent", "replied", "bounced",
            "unsubscribed", "cancelled"] in rows  # fmt: skip
    assert ["1", "-", "Hello {{ name }}", "start", "0", "2", "1", "0", "0", "0"] in rows
    assert ["2", "3d", "Re: Hello {{ name }}", "reply", "1", "0", "0", "0", "0", "0"] in rows
    assert ["3", "4h", "Last call", "new", "0", "0", "0", "0", "0", "0"] in rows
    listed = run_json(cli, "campaign", "tasks", cid, "--step", "2")
    assert [(t["id"], t["step"]) for t in listed] == [(task_id(cid, 1, 2), 2)]
    everything = run_json(cli, "campaign", "tasks", cid)
    assert sorted(t["step"] for t in everything) == [1, 1, 2]
    assert len(run_json(cli, "campaign", "tasks", cid, "--limit", "2")) == 2
    code, out, _ = run(cli, "campaign", "tasks", cid, "--step", "2")
    assert code == 0 and task_id(cid, 1, 2) in out


@pytest.mark.parametrize("step", ["0", "11"])
def test_tasks_refuse_a_step_out_of_range(cli: CliRunner, step: str) -> None:
    assert create(cli, "--steps", "steps.yaml")[0] == 0
    cid = run_json(cli, "campaign", "list")[0]["id"]
    code, _, err = run(cli, "campaign", "tasks", cid, "--step", step)
    assert code == 2 and err.startswith("error: step:"), err


def test_a_campaign_from_templates_shows_its_one_step(cli: CliRunner) -> None:
    assert create(cli, "--subject", "Hi", "--body-file", "first.txt")[0] == 0
    cid = run_json(cli, "campaign", "list")[0]["id"]
    steps = run_json(cli, "campaign", "show", cid)["steps"]
    assert [(s["number"], s["after"], s["subject"]) for s in steps] == [(1, None, "Hi")]
