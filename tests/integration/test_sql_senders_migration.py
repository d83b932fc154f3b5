"""The SQL sender store beyond the SenderStore contract (issue 13, migration 0007).

- a database from before senders (revision 0006) upgrades in place: its campaigns, recipients
  and tasks read back as before (no senders, not local time, no zones), senders and bookings
  work on it, and it downgrades again keeping its rows;
- booking for a sender the store does not know is NotFound (the bookings' foreign key);
- bookers in separate processes never pass a day's cap, and bookers that touch the same days
  in opposite orders do not deadlock;
- ``sendqueue.ops``: migrate-to carries senders, bookings, day counts and sticky recipients
  over (and refuses a target with senders), and a backup's manifest counts the new tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from sendqueue.adapters.sql import SqlTaskStore, migrate, open_store
from sendqueue.domain.errors import Conflict, NotFound, Overbooked
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Recipient
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.senders import Booking, Sender, SenderDay
from sendqueue.ops.backup import backup_sqlite
from sendqueue.ops.migrate_to import migrate_to
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.testing import FakeClock, FakeScheduler
from tests.contract.store_backends import campaign, make_task, recipients
from tests.integration.test_migrations import engine, schema_diffs, table_names, url

__all__ = ["engine", "url"]  # the fixtures: a SQLite file and a PostgreSQL database

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
NEW_COLUMNS = {
    "campaigns": {"sender_ids", "local_time"},
    "recipients": {"timezone"},
    "tasks": {"sender_id", "sender", "timezone"},
}
SENDER_TABLES = {"senders", "sender_bookings", "sender_days", "sender_contacts"}


def booking(task: str, minute: int, *, sid: str = "s1", cap: int = 50) -> Booking:
    at = T0 + timedelta(minutes=minute)
    return Booking(
        sender_id=sid,
        at=at,
        day=at.date(),
        task_id=task,
        campaign_id=task.rsplit("-", 1)[0],
        recipient=f"{task}@example.com",
        cap=cap,
    )


def columns(engine: sa.Engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def test_a_0006_database_upgrades_to_senders_and_reads_back_as_before(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, "0006")
    send_at = T0 + timedelta(hours=1)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO campaigns (id, name, policy, from_addr, state, recipient_count,"
                " created_at, updated_at) VALUES ('c1', 'C', :policy, 'a@example.com', 'active',"
                " 1, :at, :at)"
            ),
            {"policy": json.dumps(SendingPolicy().to_dict()), "at": T0},
        )
        conn.execute(
            sa.text(
                "INSERT INTO recipients (campaign_id, position, email, name, subject, text,"
                " variables) VALUES ('c1', 0, 'r@example.com', 'R', 's', 't', '{}')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO tasks (id, campaign_id, position, email, name, subject, text,"
                " send_at, state, token, attempts, created_at, updated_at, planned_at, moves,"
                " email_key) VALUES ('c1-0', 'c1', 0, 'r@example.com', '', 's', 't', :send_at,"
                " 'Pending', 'tok', 0, :at, :at, :send_at, 0, 'r@example.com')"
            ),
            {"send_at": send_at, "at": T0},
        )
    assert not SENDER_TABLES & table_names(engine)

    with open_store(url) as store:  # upgrades on open, as after a release
        assert migrate.current(url) == migrate.head() == "0014"
        assert schema_diffs(engine) == []
        old = store.get_campaign("c1")
        assert (old.sender_ids, old.local_time) == ((), False)
        assert [(c.id, c.sender_ids) for c in store.list_campaigns()] == [("c1", ())]
        assert [r.timezone for r in store.list_recipients("c1")] == [None]
        for task in (
            store.get_task("c1-0"),
            store.get_tasks(["c1-0"])["c1-0"],
            *store.list_tasks("c1"),
            *store.due_tasks(TaskState.PENDING, before=send_at + timedelta(seconds=1)),
        ):
            assert task is not None
            assert (task.sender_id, task.sender, task.timezone) == (None, None, None)
            assert task.send_at == send_at
        # The old task is claimed and sent as before.
        assert store.transition("c1-0", TaskState.PENDING, TaskState.RUNNING, at=T0)
        # Senders and bookings work on the upgraded database, beside the old rows.
        store.add_sender(Sender(id="s1", email="anna@example.com"))
        store.book([booking("c1-0", 0)])
        assert store.sender_usage("s1", since=T0.date(), until=date(2026, 12, 2)) == [
            SenderDay(T0.date(), 1, 0)
        ]
        # New campaigns carry the new fields next to the old one.
        store.create_campaign(
            campaign("c2", sender_ids=("s1",), local_time=True),
            [replace(r, timezone="Asia/Tokyo") for r in recipients(1)],
        )
        store.insert_tasks([make_task("c2", 0, sender_id="s1", timezone="Asia/Tokyo")], at=T0)
        assert store.get_campaign("c2").sender_ids == ("s1",)
        new = store.get_task("c2-0")
        assert new is not None and (new.sender_id, new.timezone) == ("s1", "Asia/Tokyo")

    migrate.downgrade(url, "0006")
    assert not SENDER_TABLES & table_names(engine)
    for table, added in NEW_COLUMNS.items():
        assert not columns(engine, table) & added, table
    with engine.connect() as conn:
        # Dropping the columns kept the rows (no table copy cascading to the tasks).
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar_one() == 2
        assert conn.execute(sa.text("SELECT count(*) FROM tasks")).scalar_one() == 2
        assert conn.execute(sa.text("SELECT count(*) FROM recipients")).scalar_one() == 2
    migrate.upgrade(url)
    assert schema_diffs(engine) == []
    with open_store(url) as store:
        assert store.get_campaign("c2").sender_ids == ()  # the column was dropped and re-added


def test_booking_for_an_unknown_sender_is_not_found_and_books_nothing(url: str) -> None:
    # A SQL store's bookings name a stored sender (a foreign key): an unknown one is refused
    # before anything is written, rather than as a database error.
    with open_store(url) as store:
        store.add_sender(Sender(id="s1", email="anna@example.com"))
        with pytest.raises(NotFound) as caught:
            store.book([booking("c1-0", 0), booking("c1-1", 5, sid="s9")])
        assert caught.value.ident == "s9"
        assert store.booking_of("c1-0") is None
        assert store.sticky_senders(["c1-0@example.com"]) == {}


def test_a_sender_is_removed_with_its_sent_bookings_but_sticky_contacts_stay(url: str) -> None:
    with open_store(url) as store:
        store.add_sender(Sender(id="s1", email="anna@example.com"))
        store.book([booking("c1-0", 0)])
        store.mark_sent("c1-0")
        store.remove_sender("s1")
        with store.engine.connect() as conn:
            for table in ("sender_bookings", "sender_days", "senders"):
                assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one() == 0
        # As the in-memory store: the planner only uses a sticky sender among the campaign's.
        assert store.sticky_senders(["c1-0@example.com"]) == {"c1-0@example.com": "s1"}
        # The address is free again.
        store.add_sender(Sender(id="s2", email="ANNA@example.com"))


_BOOKER = """
import json, sys
from datetime import UTC, datetime, timedelta
from sendqueue.adapters.sql import open_store
from sendqueue.domain.errors import Overbooked
from sendqueue.domain.senders import Booking

url, n = sys.argv[1], int(sys.argv[2])
t0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
with open_store(url) as store:
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    sys.stdin.readline()
    won = []
    for i in range(10):
        at = t0 + timedelta(minutes=n * 100 + i)
        task = f"c{n}-{i}"
        try:
            store.book([Booking("s1", at, at.date(), task, f"c{n}", task + "@example.com", 7)])
            won.append(task)
        except Overbooked:
            pass
print(json.dumps(won))
"""


def test_processes_booking_one_day_never_pass_its_cap(url: str) -> None:
    with open_store(url) as store:
        store.add_sender(Sender(id="s1", email="anna@example.com"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BOOKER, url, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0]
    won = [task for out in outputs for task in json.loads(out)]
    assert len(won) == 7
    with open_store(url) as store:
        assert store.sender_usage("s1", since=T0.date(), until=date(2026, 12, 2)) == [
            SenderDay(T0.date(), 7, 0)
        ]
        assert all(store.booking_of(task) is not None for task in won)


def test_bookers_crossing_the_same_days_in_opposite_orders_do_not_deadlock(url: str) -> None:
    # Each call books (and moves) on two senders' days; the two threads name them in opposite
    # orders. Day rows are locked in one order whatever the input's, so no call fails with a
    # deadlock (which PostgreSQL would report as an error, StoreUnavailable here).
    with open_store(url) as first:
        first.add_sender(Sender(id="s1", email="anna@example.com"))
        first.add_sender(Sender(id="s2", email="bob@example.com"))
    handles = [open_store(url), open_store(url)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(n: int, store: SqlTaskStore) -> None:
        barrier.wait()
        for i in range(30):
            pair = [
                # Both threads on the same two days (of s1 and of s2), on slots of their own.
                booking(f"c{n}-{i % 10}", n * 50 + i, sid="s1"),
                booking(f"c{n}-{10 + i % 10}", n * 50 + i, sid="s2"),
            ]
            try:
                store.book(pair if n == 0 else pair[::-1])
                if i % 3 == 0:
                    store.release([f"c{n}-{i % 10}"])
            except Overbooked:
                pass
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(n, h)) for n, h in enumerate(handles)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for h in handles:
            h.close()
    assert errors == []
    with open_store(url) as store:
        usage = store.sender_usage("s1", since=T0.date(), until=date(2026, 12, 3))
        held = [store.booking_of(f"c{n}-{i}") for n in range(2) for i in range(10)]
        assert sum(d.planned for d in usage) == sum(1 for b in held if b is not None)


@pytest.mark.postgres
def test_migrate_to_carries_senders_bookings_and_sticky_recipients_over(
    tmp_path: Path, postgres_url: str
) -> None:
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    full = Sender(
        id="s1",
        email="anna@example.com",
        name="Anna",
        transport="smtp://anna:secret@mail.example.com:587",
        daily_cap=20,
        timezone="America/New_York",
        warmup_start=5,
        warmup_step=5,
        warmup_from=date(2026, 11, 30),
    )
    with open_store(source_url) as source:
        source.create_campaign(
            campaign("c1", sender_ids=("s1", "s2"), local_time=True),
            [replace(r, timezone="Asia/Tokyo") for r in recipients(3)],
        )
        source.insert_tasks(
            [make_task("c1", i, sender_id="s1", sender=full.email) for i in range(3)], at=T0
        )
        source.add_sender(full)
        source.add_sender(Sender(id="s2", email="bob@example.com"))
        source.book([booking("c1-0", 0, cap=5), booking("c1-1", 10, cap=5)])
        source.book([booking("c1-2", 60 * 24, sid="s2")])
        assert source.mark_sent("c1-0")
        expected = {
            "senders": source.list_senders(),
            "bookings": [source.booking_of(f"c1-{i}") for i in range(3)],
            "usage": [
                source.sender_usage(s, since=T0.date(), until=date(2026, 12, 5))
                for s in ("s1", "s2")
            ],
            "times": source.booked_times("s1", since=T0, until=T0 + timedelta(days=3)),
            "sticky": source.sticky_senders([f"c1-{i}@example.com" for i in range(3)]),
        }
        task = source.get_task("c1-1")
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        report = migrate_to(source_url, target, writer, clock, batch=2)
        assert (report.senders, report.bookings) == (2, 3)
        assert target.list_senders() == expected["senders"]
        assert target.get_sender("s1").transport == full.transport
        assert [target.booking_of(f"c1-{i}") for i in range(3)] == expected["bookings"]
        assert [
            target.sender_usage(s, since=T0.date(), until=date(2026, 12, 5)) for s in ("s1", "s2")
        ] == expected["usage"]
        assert (
            target.booked_times("s1", since=T0, until=T0 + timedelta(days=3)) == (expected["times"])
        )
        assert (
            target.sticky_senders([f"c1-{i}@example.com" for i in range(3)]) == (expected["sticky"])
        )
        got = target.get_campaign("c1")
        assert (got.sender_ids, got.local_time) == (("s1", "s2"), True)
        assert [r.timezone for r in target.list_recipients("c1")] == ["Asia/Tokyo"] * 3
        assert target.get_task("c1-1") == task
        # The copied books go on: the day holds 2 of its cap 5, the slot taken stays taken.
        with pytest.raises(Overbooked):
            target.book([booking("c2-0", 10, cap=5)])
        target.book([booking("c2-0", 20, cap=5)])


@pytest.mark.postgres
def test_migrate_to_refuses_a_target_with_senders_and_changes_nothing(
    tmp_path: Path, postgres_url: str
) -> None:
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(source_url) as source:
        source.add_sender(Sender(id="s1", email="anna@example.com"))
        source.create_campaign(campaign("c1"), [Recipient(0, "r@example.com")])
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        target.add_sender(Sender(id="s9", email="anna@example.com"))
        with pytest.raises(Conflict, match="senders"):
            migrate_to(source_url, target, writer, clock)
        assert target.list_campaigns() == []
        assert [s.id for s in target.list_senders()] == ["s9"]
    with open_store(source_url) as source:
        assert source.get_campaign("c1").state_reason is None  # the source was not retired


def test_a_backup_counts_the_sender_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url) as store:
        store.add_sender(Sender(id="s1", email="anna@example.com"))
        store.book([booking("c1-0", 0), booking("c1-1", 1)])
    report = backup_sqlite(url, None, tmp_path / "backup", now=T0)
    rows = report.store.rows
    assert (rows["senders"], rows["sender_bookings"], rows["sender_days"]) == (1, 2, 1)
    assert rows["sender_contacts"] == 2
    with open_store(f"sqlite:///{tmp_path / 'backup' / 'store.db'}") as copy:
        assert copy.booking_of("c1-1") == booking("c1-1", 1)
