"""The database side of the procrastinate execution layer: procrastinate's schema and ours.

:func:`upgrade_schema` installs procrastinate's schema (the installed version's) or applies its
migration files in order, records the version in ``sendqueue_procrastinate_schema`` (which
procrastinate does not record itself), then adds this adapter's tables and indexes:

- ``sendqueue_dead_letters``: what procrastinate does not keep of a failed job (the error
  text, the time zone, the time of failure);
- ``sendqueue_parked_schedules``: schedules due beyond the horizon, not yet jobs
  (docs/performance.md, "procrastinate layer");
- partial indexes on ``procrastinate_jobs`` for the look-ups of live jobs by name and group,
  and for procrastinate's fetch of due jobs.

Backend failures raise :class:`~sendqueue.domain.errors.SchedulerError`.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import psycopg
from packaging.version import InvalidVersion, Version
from procrastinate import __version__ as PROCRASTINATE_VERSION
from procrastinate.schema import SchemaManager

from sendqueue.domain.errors import InvalidField, SchedulerError

__all__ = ["conninfo_from_url", "schema_version", "upgrade_schema"]

log = logging.getLogger("sendqueue.scheduler.procrastinate")

# pg_advisory_lock key serialising schema upgrades ("sq" + 3); the store's keys are 1 and 2.
_SCHEMA_LOCK_KEY = 0x7371_0003
_MIGRATION_FILE = re.compile(r"(\d+)\.(\d+)\.(\d+)_(\d+)_.*\.sql")

# Which procrastinate version's schema the database has (procrastinate records none itself).
_META_SCHEMA = """
CREATE TABLE IF NOT EXISTS sendqueue_procrastinate_schema (
    id integer PRIMARY KEY CHECK (id = 1),
    version text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_SENDQUEUE_SCHEMA = """
CREATE TABLE IF NOT EXISTS sendqueue_dead_letters (
    seq bigserial PRIMARY KEY,
    id text NOT NULL UNIQUE,
    job_id bigint UNIQUE,
    schedule_name text NOT NULL,
    grp text NOT NULL,
    timezone text NOT NULL,
    payload jsonb NOT NULL,
    max_retries integer NOT NULL,
    error text NOT NULL,
    attempts integer NOT NULL,
    failed_at timestamptz NOT NULL
);
-- Schedules due beyond the horizon wait here, not in procrastinate (docs/performance.md).
CREATE TABLE IF NOT EXISTS sendqueue_parked_schedules (
    name text PRIMARY KEY,
    grp text NOT NULL,
    due_at timestamptz NOT NULL,
    args jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS sendqueue_parked_due_idx ON sendqueue_parked_schedules (due_at);
CREATE INDEX IF NOT EXISTS sendqueue_parked_group_idx
    ON sendqueue_parked_schedules (grp, name COLLATE "C");
-- get() and create() look a schedule up by name, list() pages a group by name: both only
-- among live jobs, which procrastinate's own indexes do not cover.
CREATE INDEX IF NOT EXISTS sendqueue_jobs_live_name_idx
    ON procrastinate_jobs (queueing_lock)
    WHERE status IN ('todo', 'doing');
CREATE INDEX IF NOT EXISTS sendqueue_jobs_live_group_idx
    ON procrastinate_jobs (queue_name, queueing_lock COLLATE "C")
    WHERE status IN ('todo', 'doing');
-- Lets procrastinate's fetch look up the due jobs among many waiting ones (docs/performance.md).
CREATE INDEX IF NOT EXISTS sendqueue_jobs_todo_scheduled_idx
    ON procrastinate_jobs (scheduled_at)
    WHERE status = 'todo';
"""


def conninfo_from_url(url: str) -> str:
    """The libpq URI of a SQLAlchemy-style PostgreSQL URL (``postgresql+psycopg://...``)."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    raise InvalidField(
        "database_url", url, "the procrastinate execution layer needs postgresql+psycopg://..."
    )


def _migrations() -> list[tuple[Version, int, Path]]:
    found: list[tuple[Version, int, Path]] = []
    for path in Path(SchemaManager.get_migrations_path()).iterdir():
        match = _MIGRATION_FILE.fullmatch(path.name)
        if match is not None:
            major, minor, patch, seq = (int(g) for g in match.groups())
            found.append((Version(f"{major}.{minor}.{patch}"), seq, path))
    return sorted(found, key=lambda item: (item[0], item[1]))


def schema_version(url: str) -> str | None:
    """The procrastinate version whose schema the database at ``url`` has; None if none."""
    try:
        with psycopg.connect(conninfo_from_url(url), connect_timeout=10) as conn:
            table = conn.execute(
                "SELECT to_regclass('sendqueue_procrastinate_schema') IS NOT NULL"
            ).fetchone()
            if table is None or not table[0]:
                return None
            row = conn.execute("SELECT version FROM sendqueue_procrastinate_schema").fetchone()
    except psycopg.Error as exc:
        raise SchedulerError(f"procrastinate schema: cannot read its version: {exc}") from exc
    return None if row is None else str(row[0])


def upgrade_schema(url: str) -> str:
    """Install or upgrade procrastinate's schema and this adapter's tables; returns the version.

    A database without procrastinate gets procrastinate's ``schema.sql`` (the installed
    version's). A database with an older recorded version gets procrastinate's migration files
    newer than that version, in order, each in its own transaction (some add enum values, which
    a later statement of the same transaction could not use). Idempotent; concurrent runs wait
    for each other on an advisory lock. Stop the workers before upgrading across versions
    whose migrations are marked ``pre``/``post`` (docs/deploy-postgres.md).
    """
    target = Version(PROCRASTINATE_VERSION)
    try:
        with psycopg.connect(conninfo_from_url(url), connect_timeout=10, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK_KEY,))
            try:
                return str(_upgrade_locked(conn, target))
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK_KEY,))
    except psycopg.Error as exc:
        raise SchedulerError(f"procrastinate schema upgrade failed: {exc}") from exc


def _upgrade_locked(conn: psycopg.Connection[Any], target: Version) -> Version:
    # Raw SQL: SchemaManager.apply_schema has its own transaction, no migrations, no version.
    installed_row = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()
    installed = bool(installed_row and installed_row[0])
    with conn.transaction():
        conn.execute(_META_SCHEMA)
        row = conn.execute("SELECT version FROM sendqueue_procrastinate_schema").fetchone()
    recorded: Version | None = None
    if row is not None:
        try:
            recorded = Version(str(row[0]))
        except InvalidVersion:
            recorded = None
    if not installed:
        with conn.transaction():
            # psycopg sends a query without parameters as it is: no placeholder parsing.
            conn.execute(SchemaManager.get_schema())
            _record(conn, target)
        recorded = target
    elif recorded is None:
        # Installed by other means (``procrastinate schema --apply``): assume this version's.
        log.warning("procrastinate's schema was not installed by sendqueue; assuming %s", target)
        with conn.transaction():
            _record(conn, target)
        recorded = target
    elif recorded > target:
        raise SchedulerError(
            f"the database has procrastinate's schema {recorded}, newer than the installed "
            f"procrastinate {target}; upgrade the sendqueue installation"
        )
    for version, _, path in _migrations():
        if recorded < version <= target:
            log.info("applying procrastinate migration %s", path.name)
            with conn.transaction():
                conn.execute(path.read_text(encoding="utf-8"))
    if recorded < target:
        with conn.transaction():
            _record(conn, target)
    with conn.transaction():
        conn.execute(_SENDQUEUE_SCHEMA)
    return target


def _record(conn: psycopg.Connection[Any], version: Version) -> None:
    conn.execute(
        "INSERT INTO sendqueue_procrastinate_schema (id, version) VALUES (1, %s) "
        "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, applied_at = now()",
        (str(version),),
    )
