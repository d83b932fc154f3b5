"""``sendqueue db backup PATH``: an online, consistent copy of the SQLite task store and the
scheduler file, taken while a writer keeps creating, provisioning and sending campaigns.

A torn copy would show: a campaign with fewer recipients than its count (each campaign and its
recipients are written in one transaction), or a change log that does not replay to the
stored task states (each state change and its log entry share a transaction). Each copy is
then restored and reconciled. For PostgreSQL the command says how to use pg_dump, without the
password, and exits 2.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import bootstrap
from sendqueue.cli import app as cli_app
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.support.app import T0, csv_bytes, open_policy


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key in [k for k in os.environ if k.startswith("SENDQUEUE_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return {
        "SENDQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "SENDQUEUE_SCHEDULER_URL": f"sqlite:///{tmp_path / 'scheduler.db'}",
        "SENDQUEUE_MAILER": f"maildir:{tmp_path / 'outbox'}",
    }


def _settings(env: dict[str, str]) -> Settings:
    return Settings(
        _env_file=None,
        database_url=env["SENDQUEUE_DATABASE_URL"],
        scheduler_url=env["SENDQUEUE_SCHEDULER_URL"],
        mailer=env["SENDQUEUE_MAILER"],
    )


class Writer(threading.Thread):
    """Creates campaigns of 40..80 emails, provisions them, sends and cancels some, until
    stopped: every kind of write the store and the scheduler file see."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(name="backup-writer", daemon=True)
        self.clock = FakeClock(T0)
        self.app = bootstrap(_settings(env), clock=self.clock, mailer=RecordingMailer())
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                n = 40 + (self.rounds * 7) % 41
                cid = self.app.campaign_import.create(
                    name=f"c{self.rounds}", recipients=csv_bytes(n, prefix=f"r{self.rounds}-"),
                    policy=open_policy(start=self.clock.now()), templates=Templates(),
                ).campaign.id  # fmt: skip
                self.app.provisioner.provision(cid)
                self.app.campaign_controls.cancel_task(f"{cid}-{n - 1}")
                self.clock.advance(30)
                self.app.scheduler.fire_due(self.app.invoke)  # type: ignore[attr-defined]
                self.rounds += 1
        except BaseException as exc:
            self.error = exc
        finally:
            self.app.close()


def check_consistent(directory: Path) -> dict[str, int]:
    """The checks of the module docstring on one backup; returns its manifest's row counts."""
    manifest = json.loads((directory / "backup.json").read_text())
    store = open_store(f"sqlite:///{directory / 'store.db'}")
    try:
        campaigns = store.list_campaigns()
        assert len(campaigns) == manifest["store"]["rows"]["campaigns"]
        for campaign in campaigns:
            recipients = store.list_recipients(campaign.id, limit=10_000)
            assert len(recipients) == campaign.recipient_count, campaign.id
            states: dict[str, str] = {}
            for entry in store.changes_after(0, campaign_id=campaign.id, limit=100_000):
                if entry.task_id is not None:
                    assert states.get(entry.task_id) == entry.from_state, entry
                    states[entry.task_id] = entry.to_state
            replayed = Counter(states.values())
            stored = store.count_tasks(campaign.id)
            assert {s.value: replayed.get(s.value, 0) for s in TaskState} == {
                s.value: n for s, n in stored.items()
            }, campaign.id
    finally:
        store.close()
    scheduler = EmbeddedScheduler(f"sqlite:///{directory / 'scheduler.db'}")
    try:
        assert len(scheduler.dead_letters()) == manifest["scheduler"]["rows"]["dead_letters"]
    finally:
        scheduler.close()
    rows: dict[str, int] = manifest["store"]["rows"]
    return rows


def test_backups_taken_while_a_writer_runs_are_consistent_and_restore(
    env: dict[str, str], tmp_path: Path
) -> None:
    runner = CliRunner()
    # the files exist before the first backup
    first = bootstrap(_settings(env))
    first.store.list_campaigns()
    first.scheduler.list("none")
    first.close()
    writer = Writer(env)
    writer.start()
    taken: list[dict[str, int]] = []
    try:
        for i in range(4):
            while writer.rounds < 2 * (i + 1) and writer.is_alive():
                threading.Event().wait(0.02)
            target = tmp_path / "backups" / f"b{i}"
            result = runner.invoke(cli_app, ["db", "backup", str(target), "--json"], env=env)
            assert result.exit_code == 0, result.stderr
            report = json.loads(result.stdout)
            assert report["store"]["target"] == str(target / "store.db")
            assert report["scheduler"]["target"] == str(target / "scheduler.db")
            assert sorted(p.name for p in target.iterdir()) == [
                "backup.json", "scheduler.db", "store.db",
            ]  # fmt: skip
            taken.append(check_consistent(target))
    finally:
        writer.stop.set()
        writer.join(60)
    assert writer.error is None, writer.error
    assert not writer.is_alive()
    # the copies were taken as the writer went on, and each is a later moment than the last
    assert taken[0]["campaigns"] >= 2
    assert [t["campaigns"] for t in taken] == sorted(t["campaigns"] for t in taken)
    assert taken[-1]["campaigns"] > taken[0]["campaigns"]

    # restore the last copy in place of the live files and reconcile: usable as it is
    last = tmp_path / "backups" / "b3"
    restored = {
        **env,
        "SENDQUEUE_DATABASE_URL": f"sqlite:///{last / 'store.db'}",
        "SENDQUEUE_SCHEDULER_URL": f"sqlite:///{last / 'scheduler.db'}",
    }
    reconciled = runner.invoke(cli_app, ["reconcile", "--json"], env=restored)
    assert reconciled.exit_code == 0, reconciled.stderr
    app = bootstrap(_settings(restored))
    try:
        scheduler: Any = app.scheduler
        for campaign in app.store.list_campaigns():
            if campaign.state is not CampaignState.ACTIVE:
                continue
            names = {s.name for s in scheduler.list(schedule_group(campaign.id))}
            pending = app.store.list_tasks(campaign.id, state=TaskState.PENDING, limit=10_000)
            assert {expected_schedule_name(t) for t in pending} <= names
    finally:
        app.close()


def test_backup_refuses_to_overwrite_and_needs_a_store(env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli_app, ["db", "backup", str(tmp_path / "b")], env=env)
    assert missing.exit_code == 2
    assert "SENDQUEUE_DATABASE_URL" in missing.stderr and "no task store" in missing.stderr
    app = bootstrap(_settings(env))
    app.campaign_import.create(
        name="one", recipients=csv_bytes(3), policy=open_policy(), templates=Templates()
    )
    # The feedback loop's state is in the copy too: soft bounces and mailbox positions.
    store = app.store
    assert isinstance(store, SqlTaskStore)
    for key in ("box:1:1", "box:1:2"):
        store.record_soft_bounce("a@example.com", key, at=T0, since=T0)
    store.save_feedback_cursor("imap://bounces@mail.example.com/INBOX", 7, 42)
    app.close()
    (tmp_path / "scheduler.db").unlink()  # as if the execution layer never ran here
    ok = runner.invoke(cli_app, ["db", "backup", str(tmp_path / "b")], env=env)
    assert ok.exit_code == 0, ok.stderr
    assert "store.db" in ok.stdout and "reconcile" in ok.stdout
    manifest = json.loads((tmp_path / "b" / "backup.json").read_text())
    assert manifest["store"]["rows"]["soft_bounces"] == 2
    assert manifest["store"]["rows"]["feedback_cursors"] == 1
    with open_store(f"sqlite:///{tmp_path / 'b' / 'store.db'}") as copy:
        assert copy.feedback_cursor("imap://bounces@mail.example.com/INBOX") == (7, 42)
        assert copy.record_soft_bounce("a@example.com", "box:1:2", at=T0, since=T0) == 2
    # no scheduler file, nothing scheduled to lose: only the store is copied
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["backup.json", "store.db"]
    again = runner.invoke(cli_app, ["db", "backup", str(tmp_path / "b")], env=env)
    assert again.exit_code == 2
    assert "already holds a backup" in " ".join(again.stderr.split())
    assert not list((tmp_path / "b").glob(".*partial"))


def test_postgresql_gets_the_pg_dump_advice_without_the_password(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = "postgresql+psycopg://sq:s3cret-pw@db.example.com:5432/sendqueue"
    result = CliRunner().invoke(
        cli_app, ["db", "backup", str(tmp_path / "b")], env={**env, "SENDQUEUE_DATABASE_URL": url}
    )
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert "pg_dump" in message
    assert "postgresql://sq@db.example.com:5432/sendqueue" in message
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert not (tmp_path / "b").exists()
