"""The procrastinate execution layer in tests: PostgreSQL databases for its schedulers.

:func:`contract_harness` is the builder the Scheduler contract module lists in its
``BUILDERS``: each scheduler it builds starts on emptied tables of one database per test
process. Without a reachable PostgreSQL server it skips (fails in CI), like the
``postgres_url`` fixture.
"""

from __future__ import annotations

import atexit
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
from sendqueue.adapters.procrastinate.schema import conninfo_from_url, upgrade_schema
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock
from tests.conftest import POSTGRES_ADMIN_URL, missing

if TYPE_CHECKING:
    from tests.contract.test_scheduler import Harness

__all__ = ["EmptiedDatabaseScheduler", "contract_harness", "create_database", "drop_database"]


def _admin() -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        missing(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc}".strip())
        raise


def create_database() -> str:
    """A new empty database; returns its SQLAlchemy URL (``postgresql+psycopg://...``)."""
    name = f"sq_test_{secrets.token_hex(6)}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_shared: dict[str, str] = {}


def _process_database() -> str:
    """One database per test process, made on first use and dropped when the process exits;
    each scheduler built on it starts from empty tables (TRUNCATE is much faster than
    CREATE DATABASE)."""
    if "url" not in _shared:
        url = create_database()
        atexit.register(drop_database, url)
        upgrade_schema(url)
        _shared["url"] = url
    return _shared["url"]


class EmptiedDatabaseScheduler(ProcrastinateScheduler):
    """A ProcrastinateScheduler on this process's test database, emptied first."""

    def __init__(self, **kwargs: Any) -> None:
        url = _process_database()
        with psycopg.connect(conninfo_from_url(url), autocommit=True) as conn:
            conn.execute(
                "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers, "
                "procrastinate_periodic_defers, sendqueue_dead_letters, sendqueue_parked_schedules "
                "RESTART IDENTITY CASCADE"
            )
        super().__init__(url, upgrade=False, **kwargs)


def contract_harness(clock: FakeClock, alarm: RecordingAlarm, tmp: Path) -> Harness:
    """The contract module's builder for the procrastinate adapter (firing via fire_due)."""
    from tests.contract.test_scheduler import Harness

    scheduler = EmptiedDatabaseScheduler(
        clock=clock, alarm=alarm, retry_backoff=5.0, max_backoff=300.0, pool_size=4
    )
    return Harness(scheduler, clock, alarm, scheduler.fire_due)
