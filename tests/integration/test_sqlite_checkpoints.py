"""Checkpoints of the SQLite files' write-ahead logs after bulk writes run on a thread of their
own: once enough rows went in, what those commits left in the log reaches the database file
without a committing thread folding it back. Other commits leave the log to SQLite's
automatic checkpoint.

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

from sendqueue.adapters import sqlite_checkpoints as checkpoints_module
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.sql import open_store
from sendqueue.adapters.sqlite_checkpoints import WalCheckpoints
from tests.contract.store_backends import T0, campaign, make_task, recipients

_THREAD = "sqlite-checkpoints"


def _in_file(path: Path, table: str) -> int:
    """How many rows of ``table`` the database file alone holds (the log not read; 0 while
    the table itself is only in the log)."""
    with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as db:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() is None:
            return 0
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def _wait_in_file(path: Path, table: str, expected: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = _in_file(path, table)
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


def test_the_task_stores_bulk_writes_reach_the_database_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "FOLD_ROWS", 150)
    path = tmp_path / "store.db"
    before = _checkpoint_threads()
    store = open_store(f"sqlite:///{path}")
    try:
        store.create_campaign(campaign("c1"), recipients(200))
        assert not _checkpoint_threads() - before  # not a bulk write: no thread
        tasks = [make_task("c1", n, send_at=T0 + timedelta(minutes=n)) for n in range(200)]
        assert store.insert_tasks(tasks[:100], at=T0) == 100
        time.sleep(0.3)  # 100 rows: fewer than a fold's 150
        assert _in_file(path, "tasks") == 0
        assert not _checkpoint_threads() - before
        assert store.insert_tasks(tasks[100:], at=T0) == 100
        assert _wait_in_file(path, "tasks", 200) == 200
        assert _checkpoint_threads() - before
    finally:
        store.close()
    assert not _checkpoint_threads() - before


def test_the_embedded_schedulers_bulk_writes_reach_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "FOLD_ROWS", 100)
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
        assert _wait_in_file(path, "schedules", 100) == 100
        assert scheduler.submit_many(items[100:])() == [None] * 200
        assert _wait_in_file(path, "schedules", 300) == 300
    finally:
        scheduler.close()
    assert not _checkpoint_threads() - before


def test_a_fold_per_so_many_rows_and_close_stops_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    db = _wal_file(path)
    before = _checkpoint_threads()
    checkpoints = WalCheckpoints(str(path), fold_rows=10)
    try:
        checkpoints.close()  # nothing started: nothing to stop
        db.execute("INSERT INTO t VALUES (1)")
        checkpoints.written(9)
        time.sleep(0.3)
        assert _in_file(path, "t") == 0
        assert not _checkpoint_threads() - before
        checkpoints.written(1)
        assert _wait_in_file(path, "t", 1) == 1
        db.execute("INSERT INTO t VALUES (2)")
        checkpoints.written(9)  # the count starts again after a fold
        time.sleep(0.3)
        assert _in_file(path, "t") == 1
        checkpoints.close()
        assert not _checkpoint_threads() - before
        checkpoints.written(10)  # a bulk write after close: a new thread
        assert _wait_in_file(path, "t", 2) == 2
    finally:
        checkpoints.close()
        db.close()
    assert not _checkpoint_threads() - before


def test_a_file_it_cannot_open_leaves_commits_to_the_automatic_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = _checkpoint_threads()
    gone = tmp_path / "removed.db"
    checkpoints = WalCheckpoints(str(gone), fold_rows=1)
    checkpoints.written(1)
    checkpoints.close()
    assert not _checkpoint_threads() - before
    assert "no checkpoint thread" in caplog.text
    assert not gone.exists()  # not made anew


def test_a_thread_that_cannot_start_leaves_the_commit_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "wal.db"
    _wal_file(path).close()
    checkpoints = WalCheckpoints(str(path), fold_rows=1)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    checkpoints.written(1)  # no error for a write that committed
    checkpoints.close()
    assert "can't start new thread" in caplog.text


def test_a_bulk_write_that_ends_after_close_starts_no_thread(tmp_path: Path) -> None:
    """A batch committed just before another thread closes the scheduler, and counted just
    after: the count finds the scheduler closed."""
    before = _checkpoint_threads()
    scheduler = EmbeddedScheduler(f"sqlite:///{tmp_path / 'scheduler.db'}")
    scheduler.close()
    scheduler._bulk_written(10 * checkpoints_module.FOLD_ROWS)
    assert not _checkpoint_threads() - before


def test_the_file_is_the_one_opened_whatever_the_directory_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "FOLD_ROWS", 10)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = open_store("sqlite:///store.db")
    try:
        store.create_campaign(campaign("c1"), recipients(20))
        monkeypatch.chdir(tmp_path / "b")
        tasks = [make_task("c1", n, send_at=T0 + timedelta(minutes=n)) for n in range(20)]
        assert store.insert_tasks(tasks, at=T0) == 20
        assert _wait_in_file(tmp_path / "a" / "store.db", "tasks", 20) == 20
        assert list((tmp_path / "b").iterdir()) == []
    finally:
        store.close()
