"""EmbeddedScheduler.submit_many: a batch checked on the caller's thread and written on the
scheduler's own, while the caller goes on. Its answers are create_many's (the BulkScheduler
contract runs on it too, tests/contract/test_bulk_scheduler.py); here, what is its own: the
caller does not wait, the rows are the ones create_many writes, a failed write raises at the
wait and writes nothing, a name taken meanwhile is answered as create_many would, and close()
lets submitted writes end."""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.domain.errors import Conflict, InvalidField, SchedulerError
from sendqueue.ports import DueArgs
from sendqueue.testing.clock import FakeClock
from tests.support.app import T0

AT = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)  # 09:00 in Berlin


def _item(name: str, token: str, group: str = "sq-c1", at: datetime = AT) -> DueArgs:
    return (name, group, at, "Europe/Berlin", {"kind": "send", "task_id": name}, token, 2)


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM schedules ORDER BY name").fetchall()


def _locked(path: Path) -> sqlite3.Connection:
    """Another connection holding the file's write lock until it commits or rolls back."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "s.db"


@pytest.fixture
def scheduler(path: Path) -> EmbeddedScheduler:
    return EmbeddedScheduler(f"sqlite:///{path}", clock=FakeClock(T0))


def test_the_caller_goes_on_while_the_batch_waits_for_the_write_lock(
    scheduler: EmbeddedScheduler, path: Path
) -> None:
    other = _locked(path)
    wait = scheduler.submit_many([_item(f"n-{i}", f"t{i}") for i in range(300)])
    assert _rows(path) == []  # returned while the write waits for the lock
    other.execute("ROLLBACK")
    assert wait() == [None] * 300
    assert [row[0] for row in _rows(path)] == sorted(f"n-{i}" for i in range(300))


names = st.lists(
    st.from_regex(r"[0-9a-zA-Z_.\-]{1,64}", fullmatch=True), min_size=1, max_size=40, unique=True
)
payloads = st.dictionaries(st.text(max_size=12), st.text(max_size=30), max_size=4)
instants = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2028, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=40, deadline=None)
@given(
    batch=names.flatmap(
        lambda ns: st.tuples(
            st.just(ns),
            st.lists(payloads, min_size=len(ns), max_size=len(ns)),
            st.lists(instants, min_size=len(ns), max_size=len(ns)),
        )
    ),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]),
)
def test_the_rows_are_the_ones_create_many_writes(
    batch: tuple[list[str], list[dict[str, str]], list[datetime]], zone: str
) -> None:
    """Every column of every row, for any names, payload text (quotes, backslashes, control
    and non-ASCII characters) and instant (repeated and skipped hours in its zone)."""
    ns, ps, ats = batch
    items: list[DueArgs] = [
        (n, "sq-g", at, zone, p, f"tok-{i}", 1)
        for i, (n, p, at) in enumerate(zip(ns, ps, ats, strict=True))
    ]
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for way in ("create_many", "submit_many"):
            path = Path(tmp) / f"{way}.db"
            with EmbeddedScheduler(f"sqlite:///{path}", clock=FakeClock(T0)) as scheduler:
                if way == "create_many":
                    assert scheduler.create_many(items) == [None] * len(items)
                else:
                    assert scheduler.submit_many(items)() == [None] * len(items)
                stored = [dict(s.payload) for s in scheduler.list("sq-g", limit=100)]
                assert stored == [p for _, p in sorted(zip(ns, ps, strict=True))]
            rows.append(_rows(path))
    assert rows[0] == rows[1]


def test_a_batch_that_shares_no_group_is_written_before_it_returns(
    scheduler: EmbeddedScheduler, path: Path
) -> None:
    wait = scheduler.submit_many([_item("a-1", "t1", "sq-a"), _item("b-1", "t2", "sq-b")])
    assert [row[0] for row in _rows(path)] == ["a-1", "b-1"]
    assert wait() == [None, None]


def test_an_invalid_item_raises_at_the_call_and_nothing_is_written(
    scheduler: EmbeddedScheduler, path: Path
) -> None:
    bad = ("n-1", "sq-c1", AT, "Europe/Berlin", {"kind": "send"}, "bad token!", 2)
    with pytest.raises(InvalidField, match="client_token"):
        scheduler.submit_many([_item("n-0", "t0"), bad])
    assert _rows(path) == []


def test_a_write_that_fails_raises_at_the_wait_and_writes_nothing(path: Path) -> None:
    scheduler = EmbeddedScheduler(f"sqlite:///{path}", clock=FakeClock(T0), busy_timeout=0.2)
    other = _locked(path)
    try:
        wait = scheduler.submit_many([_item(f"n-{i}", f"t{i}") for i in range(10)])
        with pytest.raises(SchedulerError, match="locked"):
            wait()
    finally:
        other.execute("ROLLBACK")
    assert _rows(path) == []
    assert scheduler.submit_many([_item("n-0", "t0"), _item("n-1", "t1")])() == [None, None]
    scheduler.close()


def test_a_name_taken_before_the_write_is_answered_as_create_many_would(
    scheduler: EmbeddedScheduler, path: Path
) -> None:
    """Checked free, then taken by another process before the write: the write is undone
    and the batch looked up, here: the same token is the schedule asked for, another one a
    Conflict in its slot, and the rest is written once."""
    other = _locked(path)
    items = [_item(f"n-{i}", f"t{i}") for i in range(5)]
    wait = scheduler.submit_many(items)
    insert = (
        "INSERT INTO schedules (name, grp, at_local, timezone, payload, client_token, due_at, "
        "max_retries, attempts, created_at) VALUES (?, 'sq-c1', '2026-12-01T09:00:00', "
        "'Europe/Berlin', '{}', ?, 0, 2, 0, 0)"
    )
    other.execute(insert, ("n-1", "t1"))
    other.execute(insert, ("n-3", "someone-else"))
    other.execute("COMMIT")
    out = wait()
    assert [type(r).__name__ if r else None for r in out] == [None, None, None, "Conflict", None]
    assert isinstance(out[3], Conflict) and "n-3" in str(out[3])
    rows = {row[0]: row[5] for row in _rows(path)}
    assert rows == {"n-0": "t0", "n-1": "t1", "n-2": "t2", "n-3": "someone-else", "n-4": "t4"}


def test_close_lets_submitted_writes_end_first(path: Path) -> None:
    scheduler = EmbeddedScheduler(f"sqlite:///{path}", clock=FakeClock(T0))
    other = _locked(path)
    scheduler.submit_many([_item(f"n-{i}", f"t{i}") for i in range(50)])
    threading.Timer(0.3, lambda: other.execute("ROLLBACK")).start()
    scheduler.close()  # waits for the write, which waits for the lock
    assert len(_rows(path)) == 50


def test_the_writer_thread_writes_batches_in_the_order_submitted(
    scheduler: EmbeddedScheduler, path: Path
) -> None:
    other = _locked(path)  # both batches wait, queued, for the lock
    first = scheduler.submit_many([_item("n-0", "a"), _item("n-1", "a")])
    second = scheduler.submit_many([_item("n-1", "b"), _item("n-2", "b")])
    other.execute("ROLLBACK")
    out = second()
    assert first() == [None, None]
    assert isinstance(out[0], Conflict) and out[1] is None
    assert {row[0]: row[5] for row in _rows(path)} == {"n-0": "a", "n-1": "a", "n-2": "b"}


def test_a_batch_written_at_once_raises_its_error_at_the_wait_too(path: Path) -> None:
    scheduler = EmbeddedScheduler(f"sqlite:///{path}", clock=FakeClock(T0), busy_timeout=0.1)
    other = _locked(path)
    try:
        # two groups: not one shared statement, so written before submit_many returns
        wait = scheduler.submit_many([_item("a-1", "t1", "sq-a"), _item("b-1", "t2", "sq-b")])
        with pytest.raises(SchedulerError, match="locked"):
            wait()
    finally:
        other.execute("ROLLBACK")
        scheduler.close()
    assert _rows(path) == []


def test_a_closed_scheduler_answers_a_submitted_batch_with_a_scheduler_error(path: Path) -> None:
    scheduler = EmbeddedScheduler(f"sqlite:///{path}", clock=FakeClock(T0))
    scheduler.close()
    wait = scheduler.submit_many([_item("n-0", "t0"), _item("n-1", "t1")])
    with pytest.raises(SchedulerError, match="closed"):
        wait()
