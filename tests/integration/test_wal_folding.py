"""The WAL folder: SQLite's log folded back into the database on a thread of its own.

On real files: a log past the folder's size is folded without the writer folding it (the
writer's own autocheckpoint is off here, so only the folder can), a small log starts no
thread, and ``close()`` stops the thread while a later commit starts it again. The task store
and the embedded scheduler each run one for their file.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.sql import SqliteTaskStore
from sendqueue.adapters.sqlite_wal import WalFolder
from tests.support.app import csv_bytes, fake_app, open_policy

FOLD = 64 * 1024


def _writer(path: Path) -> sqlite3.Connection:
    """A connection that never folds the log itself, and cuts it back to nothing once folded."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA wal_autocheckpoint = 0")
    db.execute("PRAGMA journal_size_limit = 0")
    db.execute("CREATE TABLE IF NOT EXISTS t (v TEXT)")
    return db


def _write(db: sqlite3.Connection, kib: int) -> None:
    db.execute("BEGIN IMMEDIATE")
    db.executemany("INSERT INTO t (v) VALUES (?)", [("x" * 1024,) for _ in range(kib)])
    db.execute("COMMIT")


def _log_size(path: Path) -> int:
    return os.stat(f"{path}-wal").st_size


def _wait_for(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _folder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("wal-folder")]


def test_a_long_log_is_folded_by_the_folder_and_the_next_write_restarts_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f.db"
    db = _writer(path)
    folder = WalFolder(str(path), fold_bytes=FOLD)
    _write(db, 256)
    assert _log_size(path) > FOLD
    folder.committed()
    _wait_for(lambda: folder.folds >= 1)
    _write(db, 1)  # every frame was folded: this write starts the log over, cut back
    assert _log_size(path) < FOLD
    assert db.execute("SELECT count(*) FROM t").fetchone() == (257,)
    folder.close()
    db.close()


def test_without_the_folder_the_log_keeps_growing(tmp_path: Path) -> None:
    # The control for the test above: with the writer's autocheckpoint off, nothing else folds.
    path = tmp_path / "f.db"
    db = _writer(path)
    _write(db, 256)
    grown = _log_size(path)
    _write(db, 1)
    assert _log_size(path) > grown
    db.close()


def test_a_short_log_starts_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    db = _writer(path)
    folder = WalFolder(str(path), fold_bytes=FOLD)
    _write(db, 8)
    folder.committed()
    assert folder.folds == 0
    assert folder._thread is None
    folder.close()
    db.close()


def test_close_stops_the_thread_and_a_later_commit_starts_it_again(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    db = _writer(path)
    folder = WalFolder(str(path), fold_bytes=FOLD)
    _write(db, 256)
    folder.committed()
    _wait_for(lambda: folder.folds == 1)
    folder.close()
    assert not _folder_threads()
    _write(db, 1)  # restarts the log
    _write(db, 256)
    folder.committed()
    _wait_for(lambda: folder.folds == 2)
    folder.close()
    assert not _folder_threads()
    db.close()


def test_the_task_store_folds_its_file_and_close_stops_the_folder(tmp_path: Path) -> None:
    store = SqliteTaskStore(f"sqlite:///{tmp_path / 'store.db'}")
    assert store._folder is not None
    store._folder._fold_bytes = FOLD
    app = fake_app(store=store)
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(600), policy=open_policy()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    _wait_for(lambda: store._folder is not None and store._folder.folds > 0)
    store.close()
    assert not _folder_threads()


def test_the_embedded_scheduler_folds_its_file(tmp_path: Path) -> None:
    scheduler = EmbeddedScheduler(f"sqlite:///{tmp_path / 'schedules.db'}")
    assert scheduler._folder is not None
    scheduler._folder._fold_bytes = FOLD
    at = datetime(2099, 1, 5, 9, 0)
    for n in range(300):
        scheduler.create(f"s-{n}", "g", at, "UTC", {"kind": "send", "pad": "p" * 512}, f"t{n}")
    _wait_for(lambda: scheduler._folder is not None and scheduler._folder.folds > 0)
    scheduler.close()
    assert not _folder_threads()
