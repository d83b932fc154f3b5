"""``sendqueue campaign step add|update``, end to end on the embedded default (SQLite files
in a temp dir)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.sql import open_store
from sendqueue.cli import app


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


def _campaign(cli: CliRunner, tmp_path: Path) -> str:
    (tmp_path / "p.csv").write_text(
        "email,name,company\nada@example.com,Ada,AE\ngrace@example.com,Grace,Navy\n",
        encoding="utf-8",
    )
    (tmp_path / "body.txt").write_text("Hello {{ name }}\n", encoding="utf-8")
    code, out, err = run(
        cli, "campaign", "create", "--name", "Seq", "--recipients", "p.csv",
        "--subject", "News for {{ company }}", "--body-file", "body.txt",
        "--start", "2030-01-07T09:00", "--json",
    )  # fmt: skip
    assert code == 0, err
    cid: str = json.loads(out)["id"]
    return cid


def test_a_step_is_added_then_step_1_is_edited_and_its_pending_emails_re_rendered(
    cli: CliRunner, tmp_path: Path
) -> None:
    cid = _campaign(cli, tmp_path)
    (tmp_path / "two.txt").write_text("Any news, {{ name }}?\n", encoding="utf-8")
    (tmp_path / "two.html").write_text("<p>Any news?</p>\n", encoding="utf-8")

    code, out, err = run(
        cli, "campaign", "step", "add", cid, "--after", "3d", "--body-file", "two.txt",
        "--html-file", "two.html",
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == f"step 2 added to {cid}: 0 recipients got it now"
    assert run(cli, "campaign", "provision", cid, "--json")[0] == 0

    code, out, err = run(
        cli, "campaign", "step", "update", cid, "1", "--subject", "Fresh news, {{ name }}", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert (data["rerendered"], data["cancelled"]) == (2, 0)
    assert data["step"]["subject"] == "Fresh news, {{ name }}"
    assert data["step"]["text"] == "Hello {{ name }}\n"
    with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        steps = store.get_campaign(cid).steps
        subjects = sorted(t.subject for t in store.list_tasks(cid, limit=10))
    assert [s.number for s in steps] == [1, 2] and steps[1].after is not None
    assert steps[1].html == "<p>Any news?</p>\n"
    assert subjects == ["Fresh news, Ada", "Fresh news, Grace"]

    (tmp_path / "new.txt").write_text("Hello again {{ name }}\n", encoding="utf-8")
    code, out, err = run(cli, "campaign", "step", "update", cid, "1", "--body-file", "new.txt")
    assert code == 0, err
    assert out.strip() == f"step 1 of {cid} updated: 2 pending emails re-rendered"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["add", "{cid}", "--after", "0d", "--body-file", "bad.txt"], "steps[2].after"),
        (["add", "{cid}", "--after", "1d", "--body-file", "bad.txt"], "steps[2].text"),
        (["add", "{cid}", "--after", "1d", "--body-file", "missing.txt"], "body_file"),
        (["update", "{cid}", "1", "--subject", "{{ nope }}"], "steps[1].subject"),
        (["update", "{cid}", "3", "--subject", "x"], "number"),
        (["update", "{cid}", "1"], "subject"),
    ],
)
def test_bad_edits_exit_2_naming_the_field_and_change_nothing(
    cli: CliRunner, tmp_path: Path, args: list[str], field: str
) -> None:
    cid = _campaign(cli, tmp_path)
    (tmp_path / "bad.txt").write_text("Hi {{ missing_column }}\n", encoding="utf-8")

    code, _, err = run(cli, "campaign", "step", *(a.replace("{cid}", cid) for a in args))

    assert code == 2
    assert field in err
    with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        assert len(store.get_campaign(cid).steps) == 1


def test_editing_an_unknown_or_cancelled_campaign_exits_1(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("x\n", encoding="utf-8")
    code, _, err = run(
        cli, "campaign", "step", "add", "nope", "--after", "1d", "--body-file", "b.txt"
    )
    assert code == 1 and "nope" in err
    cid = _campaign(cli, tmp_path)
    assert run(cli, "campaign", "cancel", cid)[0] == 0
    code, _, err = run(cli, "campaign", "step", "add", cid, "--after", "1d", "--body-file", "b.txt")
    assert code == 1 and "cancelled" in err
