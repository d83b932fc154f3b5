"""Checkpoints of the SQLite files' write-ahead logs after bulk writes run on a thread of their
own: what such a commit leaves in the log reaches the database file without the committing
thread folding it back. Other commits leave the log to SQLite's automatic checkpoint.

A connection opened ``immutable`` reads the database file alone, never the log: it sees a row
only once a checkpoint has copied it there. The writers' automatic checkpoint only runs at
10,000 pages, far more than these tests write, so only the checkpoint thread can copy them.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.sql import open_store
from sendqueue.adapters.sqlite_checkpoints import WalCheckpoints
from tests.contract.store_backends import T0, campaign, make_task, recipients

_THREAD = "sqlite-checkpoints"


def _in_file(path: Path, sql: str) -> int:
    """``sql``'s count as the database file alone holds it (the log not read)."""
    with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as db:
        return int(db.execute(sql).fetchone()[0])


def _wait_in_file(path: Path, sql: str, expected: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = _in_file(path, sql)
        except sqlite3.DatabaseError:  # read while a checkpoint writes the file: read again
            found = -1
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _checkpoint_threads() -> set[threading.Thread]:
    """The checkpoint threads alive (another test's store may hold one: compare sets)."""
    return {t for t in threading.enumerate() if t.name == _THREAD}


def _wal_file(path: Path, *, autocheckpoint: int = 0) -> sqlite3.Connection:
    """A connection to a new WAL file of one table, its own automatic checkpoint as given."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
    db.execute("CREATE TABLE t (n INTEGER)")
    return db


def test_the_task_stores_commits_reach_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    before = _checkpoint_threads()
    store = open_store(f"sqlite:///{path}")
    try:
        store.create_campaign(campaign("c1"), recipients(200))
        assert not _checkpoint_threads() - before  # not a bulk write: no thread
        tasks = [make_task("c1", n, send_at=T0 + timedelta(minutes=n)) for n in range(200)]
        assert store.insert_tasks(tasks, at=T0) == 200
        assert _wait_in_file(path, "SELECT count(*) FROM tasks", 200) == 200
        assert _checkpoint_threads() - before
    finally:
        store.close()
    assert not _checkpoint_threads() - before


def test_the_embedded_schedulers_commits_reach_its_file(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.db"
    before = _checkpoint_threads()
    scheduler = EmbeddedScheduler(f"sqlite:///{path}")
    try:
        items = [
            (f"sq-c1-{n}-0", "sq-c1", T0 + timedelta(minutes=n), "Europe/Berlin",
             {"kind": "send", "task_id": f"c1-{n}", "token": "t"}, f"tok{n}", 2)
            for n in range(300)
        ]  # fmt: skip
        assert scheduler.create_many(items[:100]) == [None] * 100
        assert _wait_in_file(path, "SELECT count(*) FROM schedules", 100) == 100
        assert scheduler.submit_many(items[100:])() == [None] * 200
        assert _wait_in_file(path, "SELECT count(*) FROM schedules", 300) == 300
    finally:
        scheduler.close()
    assert not _checkpoint_threads() - before


def test_one_checkpoint_per_interval_and_close_does_not_wait_for_it(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    db = _wal_file(path)
    before = _checkpoint_threads()
    checkpoints = WalCheckpoints(str(path), interval=60.0)
    try:
        db.execute("INSERT INTO t VALUES (1)")
        checkpoints.committed()
        assert _wait_in_file(path, "SELECT count(*) FROM t", 1) == 1
        db.execute("INSERT INTO t VALUES (2)")
        checkpoints.committed()
        time.sleep(0.5)  # the next checkpoint waits for the interval (60 s)
        assert _in_file(path, "SELECT count(*) FROM t") == 1
        started = time.monotonic()
        checkpoints.close()
        assert time.monotonic() - started < 5
        assert not _checkpoint_threads() - before
    finally:
        checkpoints.close()
        db.close()


def test_a_commit_after_close_starts_a_new_thread(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    db = _wal_file(path)
    before = _checkpoint_threads()
    checkpoints = WalCheckpoints(str(path), interval=0.01)
    try:
        checkpoints.close()  # nothing started: nothing to stop
        assert not _checkpoint_threads() - before
        db.execute("INSERT INTO t VALUES (1)")
        checkpoints.committed()
        assert _wait_in_file(path, "SELECT count(*) FROM t", 1) == 1
        checkpoints.close()
        db.execute("INSERT INTO t VALUES (2)")
        checkpoints.committed()
        assert _wait_in_file(path, "SELECT count(*) FROM t", 2) == 2
    finally:
        checkpoints.close()
        db.close()
    assert not _checkpoint_threads() - before


def test_a_file_it_cannot_open_leaves_commits_to_the_automatic_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = _checkpoint_threads()
    gone = tmp_path / "removed.db"
    checkpoints = WalCheckpoints(str(gone), interval=0.01)
    checkpoints.committed()
    checkpoints.close()
    assert not _checkpoint_threads() - before
    assert "no checkpoint thread" in caplog.text
    assert not gone.exists()  # not made anew


def test_a_thread_that_cannot_start_leaves_the_commit_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "wal.db"
    _wal_file(path).close()
    checkpoints = WalCheckpoints(str(path), interval=0.01)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    checkpoints.committed()  # no error for a write that committed
    checkpoints.close()
    assert "can't start new thread" in caplog.text
