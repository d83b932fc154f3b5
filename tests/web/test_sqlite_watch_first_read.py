"""The SQLite watch wakes its subscribers on its first data_version read, so a commit by another
connection between the watch's start and that read is not left to the 2 s fallback read."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sendqueue.adapters.sql.signal import SqliteWatch


def test_a_commit_before_the_first_data_version_read_wakes(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode = WAL")
    other.execute("CREATE TABLE t (x INTEGER)")
    watch = SqliteWatch(path, watch_interval=0.3)  # a wide first window, for determinism
    woken = threading.Event()
    unsubscribe = watch.subscribe(woken.set)
    try:
        other.execute("INSERT INTO t VALUES (1)")  # another process's commit, before the baseline
        assert woken.wait(1.5), "the commit made before the watch's first read never woke"
    finally:
        unsubscribe()
        other.close()
