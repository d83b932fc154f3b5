"""``sendqueue sender`` and the sender options of ``campaign create``, through the real command
line (Typer's CliRunner) on SQLite files in a temp dir: every output masks the transport, every
bad option exits 2 naming its field and stores nothing, usage comes from the store's bookings."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.sql import open_store
from sendqueue.cli import app
from sendqueue.domain.senders import Booking
from sendqueue.ports import SenderStore

SECRET = "hunter2-very-secret"
MAILER = f"smtp://anna:{SECRET}@mail.example.com:587?security=starttls"
MASKED = "smtp://anna:***@mail.example.com:587"


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
    return CliRunner()


def run(cli: CliRunner, *args: str) -> tuple[int, str, str]:
    result = cli.invoke(app, list(args))
    assert SECRET not in result.stdout + result.stderr, (args, result.stdout, result.stderr)
    return result.exit_code, result.stdout, result.stderr


def run_json(cli: CliRunner, *args: str) -> Any:
    code, out, err = run(cli, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def store(tmp_path: Path, cli: CliRunner) -> Iterator[SenderStore]:
    """The store the commands write (its schema made by the first command)."""
    run(cli, "sender", "list")
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        yield cast(SenderStore, opened)
    finally:
        opened.close()


def _book(store: SenderStore, sender_id: str, day_offset: int, count: int, cap: int) -> list[str]:
    """``count`` planned sends of the sender on today + ``day_offset`` (UTC days), a minute
    apart from 12:00; their task ids."""
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    noon = today + timedelta(days=day_offset)
    ids = [f"cbook{day_offset}-{i}" for i in range(count)]
    store.book(
        [
            Booking(
                sender_id=sender_id,
                at=noon + timedelta(minutes=i),
                day=noon.date(),
                task_id=task,
                campaign_id=f"cbook{day_offset}",
                recipient=f"r{day_offset}-{i}@example.com",
                cap=cap,
            )
            for i, task in enumerate(ids)
        ]
    )
    return ids


def test_add_list_show_update_remove(cli: CliRunner) -> None:
    added = run_json(
        cli, "sender", "add", "--email", "Anna@Example.com", "--name", "Anna Sales",
        "--daily-cap", "30", "--min-gap", "120", "--timezone", "America/New_York",
        "--mailer", MAILER, "--reply-to", "replies@example.com",
    )  # fmt: skip
    assert added["id"].startswith("s")
    assert added["email"].lower() == "anna@example.com"
    assert (added["daily_cap"], added["min_gap_seconds"], added["timezone"]) == (
        30, 120, "America/New_York",
    )  # fmt: skip
    assert added["transport"] == MASKED and added["reply_to"] == "replies@example.com"
    code, out, _ = run(cli, "sender", "add", "--email", "bob@example.com")
    assert code == 0 and "added sender s" in out and "50 a day" in out

    listed = run_json(cli, "sender", "list")
    assert [s["email"].lower() for s in listed] == ["anna@example.com", "bob@example.com"]
    assert listed[1]["transport"] is None and listed[1]["timezone"] == "UTC"
    code, out, _ = run(cli, "sender", "list")
    assert code == 0 and "2 senders" in out and MASKED in out and "(default mailer)" in out

    # by id or by address, in any case
    shown = run_json(cli, "sender", "show", "ANNA@example.com")
    assert shown["id"] == added["id"] and shown["transport"] == MASKED
    assert len(shown["usage"]) == 14
    assert set(shown["usage"][0]) == {"date", "planned", "sent", "cap"}
    assert {d["cap"] for d in shown["usage"]} == {30}
    assert run_json(cli, "sender", "show", added["id"], "--days", "3")["usage"][2]["cap"] == 30
    code, out, _ = run(cli, "sender", "show", added["id"])
    assert code == 0 and "usage over 14 days" in out and MASKED in out

    updated = run_json(cli, "sender", "update", added["id"], "--daily-cap", "40", "--reply-to", "")
    assert (updated["daily_cap"], updated["reply_to"]) == (40, None)
    assert updated["min_gap_seconds"] == 120
    assert updated["transport"] == MASKED  # kept, still masked
    cleared = run_json(cli, "sender", "update", added["id"], "--mailer", "")
    assert cleared["transport"] is None

    code, out, _ = run(cli, "sender", "remove", "bob@example.com")
    assert code == 0 and "removed sender" in out and "bob@example.com" in out
    assert [s["id"] for s in run_json(cli, "sender", "list")] == [added["id"]]
    code, _, err = run(cli, "sender", "show", "bob@example.com")
    assert code == 1 and "not found" in err


def test_warm_up_ramps_the_cap_per_sending_day(cli: CliRunner, store: SenderStore) -> None:
    added = run_json(
        cli, "sender", "add", "--email", "new@example.com", "--daily-cap", "10",
        "--warmup-start", "2", "--warmup-step", "3",
    )  # fmt: skip
    today = datetime.now(UTC).date()
    assert added["warmup_from"] == today.isoformat()
    usage = run_json(cli, "sender", "show", added["id"])["usage"]
    assert [d["date"] for d in usage[:2]] == [
        today.isoformat(), (today + timedelta(days=1)).isoformat(),
    ]  # fmt: skip
    assert {d["cap"] for d in usage} == {2}  # no sending day yet: any day would be the first
    _book(store, added["id"], 1, 2, cap=2)
    _book(store, added["id"], 3, 5, cap=5)
    usage = run_json(cli, "sender", "show", added["id"])["usage"]
    # tomorrow is the first sending day; the day after it counts one, and so on
    assert [d["cap"] for d in usage[:7]] == [2, 2, 5, 5, 8, 8, 8]
    code, out, _ = run(cli, "sender", "show", added["id"])
    assert code == 0 and "2 +3 per sending day" in out
    store.release([f"cbook1-{i}" for i in range(2)])  # a cancelled day still counts
    assert run_json(cli, "sender", "show", added["id"])["usage"][3]["cap"] == 5
    ended = run_json(cli, "sender", "update", added["id"], "--no-warmup")
    assert (ended["warmup_start"], ended["warmup_step"], ended["warmup_from"]) == (None, None, None)
    assert {d["cap"] for d in run_json(cli, "sender", "show", added["id"])["usage"]} == {10}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--email", "not-an-address"], "email"),
        (["--email", "Anna <a@example.com>"], "email"),
        (["--email", "a@example.com", "--daily-cap", "0"], "daily_cap"),
        (["--email", "a@example.com", "--daily-cap", "10001"], "daily_cap"),
        (["--email", "a@example.com", "--min-gap", "0"], "min_gap_seconds"),
        (["--email", "a@example.com", "--timezone", "Mars/Olympus"], "timezone"),
        (["--email", "a@example.com", "--warmup-start", "5"], "warmup_step"),
        (["--email", "a@example.com", "--warmup-step", "5"], "warmup_start"),
        (["--email", "a@b.com", "--warmup-start", "60", "--warmup-step", "1"], "warmup_start"),
        (["--email", "a@example.com", "--mailer", f"http://u:{SECRET}@x"], "transport"),
        (["--email", "a@example.com", "--mailer", f"smtp://u:{SECRET}@h\n:25"], "transport"),
        (["--email", "a@example.com", "--mailer", f"smtp://u:{SECRET}@h:port"], "transport"),
        (["--email", "a@example.com", "--mailer", f"smtp://u:{SECRET}@[::1"], "transport"),
        (["--email", "a@example.com", "--reply-to", "nope"], "reply_to"),
        (["--email", "a@example.com", "--name", "A\r\nBcc: x@example.com"], "name"),
    ],
)
def test_a_bad_option_exits_2_naming_the_field_and_adds_nothing(
    cli: CliRunner, args: list[str], field: str
) -> None:
    code, out, err = run(cli, "sender", "add", *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), err
    assert run_json(cli, "sender", "list") == []


def test_refused_updates_and_removals_change_nothing(cli: CliRunner, store: SenderStore) -> None:
    anna = run_json(cli, "sender", "add", "--email", "anna@example.com", "--mailer", MAILER)
    run_json(cli, "sender", "add", "--email", "bob@example.com")
    before = run_json(cli, "sender", "list")

    code, _, err = run(cli, "sender", "add", "--email", "ANNA@example.com")
    assert code == 1 and err.startswith("error: email:") and "belongs to sender" in err
    for args, field in [
        (["--daily-cap", "0"], "daily_cap"),
        (["--timezone", "Nowhere/Land"], "timezone"),
        (["--email", "bob@example.com"], "email"),
        (["--mailer", f"imap://anna:{SECRET}@mail.example.com"], "transport"),
        (["--warmup-step", "3"], "warmup_start"),
        (["--no-warmup", "--warmup-start", "3"], "warmup_start"),
        ([], "changes"),
    ]:
        code, _, err = run(cli, "sender", "update", anna["id"], *args)
        assert code in {1, 2} and err.startswith(f"error: {field}:"), (args, err)
    code, _, err = run(cli, "sender", "update", "nobody@example.com", "--daily-cap", "5")
    assert code == 1 and "not found" in err
    assert run_json(cli, "sender", "list") == before
    # the store keeps the transport as given: masking is for what leaves the service layer
    assert store.get_sender(anna["id"]).transport == MAILER

    _book(store, anna["id"], 0, 2, cap=50)
    code, _, err = run(cli, "sender", "remove", anna["id"])
    assert code == 1 and "2 planned sends" in err
    assert run_json(cli, "sender", "list") == before


def test_show_counts_planned_and_sent_bookings_per_day(cli: CliRunner, store: SenderStore) -> None:
    anna = run_json(cli, "sender", "add", "--email", "anna@example.com", "--daily-cap", "5")
    first = _book(store, anna["id"], 0, 3, cap=5)
    _book(store, anna["id"], 2, 5, cap=5)
    assert store.mark_sent(first[0])
    usage = run_json(cli, "sender", "show", anna["id"])["usage"]
    today = datetime.now(UTC).date()
    assert usage[0] == {"date": today.isoformat(), "planned": 2, "sent": 1, "cap": 5}
    assert usage[1]["planned"] == usage[1]["sent"] == 0
    assert (usage[2]["planned"], usage[2]["sent"]) == (5, 0)
    assert sum(d["planned"] + d["sent"] for d in usage) == 8
    code, out, _ = run(cli, "sender", "show", anna["id"])
    assert code == 0 and today.strftime("%a %Y-%m-%d") in out


def _recipients(path: Path) -> Path:
    path.write_text(
        "email,name,timezone\n"
        "ada@example.com,Ada,America/New_York\n"
        "grace@example.com,Grace,Asia/Tokyo\n"
        "linus@example.com,Linus,\n",
        "utf-8",
    )
    return path


def _create(cli: CliRunner, csv: Path, *extra: str) -> tuple[int, str, str]:
    body = csv.with_name("body.txt")
    body.write_text("Hello {{ name }}\n", "utf-8")
    return run(
        cli, "campaign", "create", "--name", "Launch", "--recipients", str(csv),
        "--subject", "Hi {{ name }}", "--body-file", str(body), "--weekdays", "mon-sun",
        "--window", "00:00-24:00", "--per-day", "100", "--from", "News <news@example.com>",
        *extra,
    )  # fmt: skip


def test_campaign_create_takes_senders_and_local_time(cli: CliRunner, tmp_path: Path) -> None:
    csv = _recipients(tmp_path / "people.csv")
    anna = run_json(cli, "sender", "add", "--email", "anna@example.com", "--mailer", MAILER)
    bob = run_json(cli, "sender", "add", "--email", "bob@example.com")

    # an unknown sender: refused naming the field, and no campaign is created
    code, out, err = _create(cli, csv, "--sender", "anna@example.com", "--sender", "x@example.com")
    assert code == 2 and out == "" and err.startswith("error: senders:") and "x@example.com" in err
    code, _, err = _create(cli, csv, "--sender", anna["id"], "--sender", "ANNA@example.com")
    assert code == 2 and err.startswith("error: senders:") and "named twice" in err
    assert run_json(cli, "campaign", "list") == []

    code, out, err = _create(
        cli, csv, "--sender", "anna@example.com", "--sender", bob["id"], "--local-time", "--json"
    )
    assert code == 0, err
    created = json.loads(out)
    assert (created["senders"], created["local_time"]) == ([anna["id"], bob["id"]], True)
    shown = run_json(cli, "campaign", "show", created["id"])
    assert (shown["senders"], shown["local_time"]) == ([anna["id"], bob["id"]], True)
    code, out, _ = run(cli, "campaign", "show", created["id"])
    assert "senders: anna@example.com, bob@example.com  local time: on" in out

    # the preview counts each recipient zone in its own days
    preview = run_json(cli, "campaign", "preview", created["id"])
    assert {z["zone"]: z["count"] for z in preview["zones"]} == {
        "UTC": 1, "America/New_York": 1, "Asia/Tokyo": 1,
    }  # fmt: skip
    assert {(s["email"], s["zone"]) for s in preview["sends"]} == {
        ("ada@example.com", "America/New_York"), ("grace@example.com", "Asia/Tokyo"),
        ("linus@example.com", "UTC"),
    }  # fmt: skip
    # in time order, each send with its recipient's position and the zone its windows are
    # read in
    assert [s["send_at"] for s in preview["sends"]] == sorted(
        s["send_at"] for s in preview["sends"]
    )
    assert [s["index"] for s in preview["sends"]] == [0, 1, 2]
    assert sorted(s["position"] for s in preview["sends"]) == [0, 1, 2]
    code, out, _ = run(cli, "campaign", "preview", created["id"])
    assert code == 0 and "per recipient zone: 3 zones" in out and "Asia/Tokyo" in out
    assert "in each recipient's local time" in out and "recipient's time" in out

    plain = json.loads(_create(cli, csv, "--json")[1])
    assert (plain["senders"], plain["local_time"]) == ([], False)
    assert [z["zone"] for z in run_json(cli, "campaign", "preview", plain["id"])["zones"]] == [
        "UTC"
    ]


def test_task_rows_carry_their_sender(cli: CliRunner, tmp_path: Path) -> None:
    csv = _recipients(tmp_path / "people.csv")
    anna = run_json(cli, "sender", "add", "--email", "anna@example.com")
    with_sender = json.loads(_create(cli, csv, "--sender", anna["id"], "--json")[1])["id"]
    without = json.loads(_create(cli, csv, "--json")[1])["id"]
    for cid in (with_sender, without):
        code, _, err = run(cli, "campaign", "provision", cid, "--json")
        assert code == 0, err

    rows = run_json(cli, "campaign", "tasks", with_sender)
    assert [r["sender"] for r in rows] == ["anna@example.com"] * 3
    assert list(rows[0])[:3] == ["id", "email", "sender"]
    # a campaign without senders sends from its From
    assert {r["sender"] for r in run_json(cli, "campaign", "tasks", without)} == {
        "News <news@example.com>"
    }
    code, out, _ = run(cli, "campaign", "tasks", with_sender)
    assert code == 0 and "sender" in out and "anna@example.com" in out
    usage = run_json(cli, "sender", "show", anna["id"])["usage"]
    assert sum(d["planned"] for d in usage) == 3


def test_an_unknown_recipient_zone_names_its_row_and_value_and_creates_nothing(
    cli: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "r.csv").write_text(
        "email,name,subject,body,timezone\n"
        "a@example.com,A,Hi,Body,Europe/Berlin\n"
        "b@example.com,B,Hi,Body,Mars/Olympus\n"
    )
    code, _, err = run(
        cli, "campaign", "create", "--name", "z", "--recipients", "r.csv", "--local-time"
    )
    assert code == 2
    assert "row 3: timezone:" in err and "'Mars/Olympus'" in err
    assert run_json(cli, "campaign", "list") in ([], {"campaigns": []})
