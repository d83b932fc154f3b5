"""Schema migrations of the SQL task store (Alembic, configured in code; no ``alembic.ini``).

``sendqueue db upgrade`` calls :func:`upgrade`; the task stores
(:class:`~sendqueue.adapters.sql.base.SqlTaskStore`) call :func:`upgrade_engine` when they open
with ``upgrade=True``. Several processes may upgrade
at once: each migration run holds the database's write lock (SQLite ``BEGIN IMMEDIATE``, a
PostgreSQL advisory lock) for its whole transaction, so the second one waits and then finds the
schema at head already.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from sendqueue.adapters.sql.schema import WRITE, create_store_engine
from sendqueue.domain.errors import InvalidField, StoreUnavailable

__all__ = [
    "MIGRATIONS_DIR",
    "current",
    "current_engine",
    "downgrade",
    "downgrade_engine",
    "head",
    "upgrade",
    "upgrade_engine",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# pg_advisory_xact_lock key serialising migration runs ("sq" + 1); distinct from the store's
# change-log key.
_MIGRATION_LOCK_KEY = 0x7371_0001


def _config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    """The newest revision shipped with this version of sendqueue."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    if revision is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return revision


@contextmanager
def _locked(engine: Engine) -> Iterator[sa.Connection]:
    with engine.execution_options(**WRITE).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
            )
        yield conn


def _run(engine: Engine, action: str, revision: str) -> None:
    try:
        with _locked(engine) as conn:
            cfg = _config(conn)
            if action == "upgrade":
                command.upgrade(cfg, revision)
            else:
                command.downgrade(cfg, revision)
    except CommandError as exc:
        raise InvalidField("revision", revision, str(exc)) from exc
    except sa_exc.SQLAlchemyError as exc:
        raise StoreUnavailable(f"migration {action} to {revision} failed: {exc}") from exc


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema behind ``engine`` to ``revision``; a no-op when it is there already."""
    _run(engine, "upgrade", revision)


def downgrade_engine(engine: Engine, revision: str) -> None:
    """Downgrade the schema behind ``engine`` to ``revision`` (``"base"`` drops everything)."""
    _run(engine, "downgrade", revision)


def current_engine(engine: Engine) -> str | None:
    """The revision the database behind ``engine`` is at; None when it was never migrated."""
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except sa_exc.SQLAlchemyError as exc:
        raise StoreUnavailable(f"cannot read the schema revision: {exc}") from exc


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the task store at ``url`` to ``revision`` (default: the newest)."""
    engine = create_store_engine(url)
    try:
        upgrade_engine(engine, revision)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    """Downgrade the task store at ``url`` to ``revision``; ``"base"`` drops every table."""
    engine = create_store_engine(url)
    try:
        downgrade_engine(engine, revision)
    finally:
        engine.dispose()


def current(url: str) -> str | None:
    """The revision of the task store at ``url``; None for an empty database."""
    engine = create_store_engine(url)
    try:
        return current_engine(engine)
    finally:
        engine.dispose()
