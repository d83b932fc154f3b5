"""Online backups of the embedded deployment: the SQLite task store and the scheduler file.

:func:`backup_sqlite` copies both files into one directory while workers keep running:

- ``PATH/store.db``: the task store (``SENDQUEUE_DATABASE_URL``);
- ``PATH/scheduler.db``: the embedded execution layer's file (``SENDQUEUE_SCHEDULER_URL``),
  when that is a file;
- ``PATH/backup.json``: what was copied, when, and the row counts of each copy.

Each file is copied with SQLite's online backup API in a single step: the copy is a
consistent snapshot of one moment (a transaction that commits meanwhile is either wholly in it
or wholly out), writers are not blocked in WAL mode, and the result is a self-contained
database (no ``-wal`` file to carry along). A copy is written under a temporary name, checked
with ``PRAGMA integrity_check`` and only then renamed into place, so a backup that fails half
way leaves no file that looks complete. Existing files are never overwritten.

The two files are two snapshots a moment apart, as the two systems are in production: restored
together, they may disagree by the schedules created or fired in between, which is exactly
the drift ``sendqueue reconcile`` repairs. Restore both, then run the reconciler once.

PostgreSQL is backed up with its own tools: :func:`postgres_advice` says how.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sendqueue.domain.errors import InvalidField
from sendqueue.services.reading.views import iso

__all__ = [
    "MANIFEST",
    "SCHEDULER_FILE",
    "STORE_FILE",
    "BackupReport",
    "CopiedFile",
    "backup_sqlite",
    "is_postgres",
    "postgres_advice",
    "sqlite_file",
]

STORE_FILE = "store.db"
SCHEDULER_FILE = "scheduler.db"
MANIFEST = "backup.json"

# Tables counted in the manifest, per file (a table that does not exist is left out).
_STORE_TABLES = (
    "campaigns",
    "recipients",
    "tasks",
    "change_log",
    "suppressions",
    "soft_bounces",
    "away_dates",
    "feedback_cursors",
    "senders",
    "sender_bookings",
    "sender_days",
    "sender_contacts",
    "webhook_endpoints",
    "webhook_deliveries",
    "dead_letter_relays",
)
_SCHEDULER_TABLES = ("schedules", "dead_letters")


@dataclass(frozen=True)
class CopiedFile:
    """One database file copied: where from, where to, its size and row counts."""

    source: Path
    target: Path
    bytes: int
    rows: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "target": str(self.target),
            "bytes": self.bytes,
            "rows": self.rows,
        }


@dataclass(frozen=True)
class BackupReport:
    """What :func:`backup_sqlite` wrote."""

    directory: Path
    store: CopiedFile
    scheduler: CopiedFile | None
    taken_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "taken_at": iso(self.taken_at),
            "store": self.store.as_dict(),
            "scheduler": self.scheduler.as_dict() if self.scheduler else None,
        }


def is_postgres(url: str) -> bool:
    """True for a PostgreSQL URL (``postgresql://`` or ``postgresql+psycopg://``)."""
    return url.split(":", 1)[0].split("+", 1)[0] == "postgresql"


def postgres_advice(url: str, directory: str) -> str:
    """How to back up a PostgreSQL task store: pg_dump, with the password left out."""
    parsed = sa.make_url(url)
    # Rebuilt without the password (URL.set(password=None) keeps it).
    shown = sa.URL.create(
        "postgresql",
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
    ).render_as_string(hide_password=False)
    dump = Path(directory) / "sendqueue.dump"
    return (
        "the task store is PostgreSQL; back it up with PostgreSQL's tools, which take a "
        f"consistent snapshot while the workers run: pg_dump --format=custom --file={dump} "
        f"'{shown}' (the password from ~/.pgpass or PGPASSWORD; restore with pg_restore "
        "--clean --dbname=...). The procrastinate jobs live in the same database, so the one "
        "dump holds both; after a restore run `sendqueue reconcile`."
    )


def sqlite_file(url: str, variable: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` URL; None for an in-memory database. Raises
    InvalidField naming ``variable`` for any other URL."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidField(variable, url, "expected sqlite:///FILE") from exc
    if parsed.get_backend_name() != "sqlite":
        raise InvalidField(variable, url, "expected sqlite:///FILE")
    database = parsed.database
    if not database or database == ":memory:":
        return None
    return Path(database)


def backup_sqlite(
    database_url: str,
    scheduler_url: str | None,
    directory: str | os.PathLike[str],
    *,
    now: datetime,
) -> BackupReport:
    """Copy the task store (and the scheduler file, if there is one) into ``directory``.

    ``directory`` is created if missing; it must not already hold a backup. Raises
    InvalidField: ``SENDQUEUE_DATABASE_URL`` not a SQLite file or the file missing,
    ``path`` when the directory holds a backup already or cannot be written; the copy itself
    failing (disk full, a corrupt source) raises InvalidField naming the file.
    """
    store_path = sqlite_file(database_url, "SENDQUEUE_DATABASE_URL")
    if store_path is None:
        raise InvalidField(
            "SENDQUEUE_DATABASE_URL", database_url, "an in-memory store has nothing to back up"
        )
    if not store_path.is_file():
        raise InvalidField("SENDQUEUE_DATABASE_URL", str(store_path), "no task store file there")
    scheduler_path = None
    if scheduler_url is not None:
        scheduler_path = sqlite_file(scheduler_url, "SENDQUEUE_SCHEDULER_URL")
        if scheduler_path is not None and not scheduler_path.is_file():
            scheduler_path = None  # never opened yet: nothing scheduled to lose
    target = Path(directory)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidField("path", str(target), f"cannot create the directory: {exc}") from exc
    if not target.is_dir():
        raise InvalidField("path", str(target), "not a directory")
    existing = [n for n in (STORE_FILE, SCHEDULER_FILE, MANIFEST) if (target / n).exists()]
    if existing:
        raise InvalidField(
            "path",
            str(target),
            f"already holds a backup ({', '.join(existing)}); choose a new directory",
        )
    store = _copy(store_path, target / STORE_FILE, _STORE_TABLES)
    scheduler = (
        _copy(scheduler_path, target / SCHEDULER_FILE, _SCHEDULER_TABLES)
        if scheduler_path is not None
        else None
    )
    report = BackupReport(target, store, scheduler, now)
    manifest = target / MANIFEST
    try:
        manifest.write_text(json.dumps(report.as_dict(), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidField("path", str(manifest), f"cannot be written: {exc}") from exc
    return report


def _copy(source: Path, target: Path, tables: tuple[str, ...]) -> CopiedFile:
    partial = target.with_name(f".{target.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    try:
        # Read-only: a backup must never create, migrate or lock the source for writing.
        src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            dst = sqlite3.connect(partial)
            try:
                # pages=-1 (the default): the whole database in one step, under one read
                # transaction, so the copy is one consistent moment even while others write.
                src.backup(dst)
                check = dst.execute("PRAGMA integrity_check").fetchone()
                if check is None or check[0] != "ok":
                    raise sqlite3.DatabaseError(f"integrity check of the copy: {check}")
                rows = _counts(dst, tables)
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(partial, target)
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise InvalidField("path", str(target), f"backup of {source} failed: {exc}") from exc
    return CopiedFile(source, target, target.stat().st_size, rows)


def _counts(conn: sqlite3.Connection, tables: tuple[str, ...]) -> dict[str, int]:
    present = {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    # The names come from the constants above, never from input.
    return {
        t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
        for t in tables
        if t in present
    }
