"""The task store on SQL databases: SQLite (the embedded default) and PostgreSQL (psycopg 3).

:func:`open_store` is the entry point: it picks the store class of the URL's dialect.

- :mod:`.schema`: the tables, and the engine set-up both dialects rely on;
- :mod:`.migrate` (with ``migrations/``): the Alembic runner;
- :mod:`.rows`: rows <-> domain objects; :mod:`.errors`: vendor errors -> sendqueue's;
- :mod:`.base`: :class:`SqlTaskStore`, what both stores share (with :mod:`.sidetables`: the
  change-log reads, leases and counters);
- :mod:`.sqlite`: :class:`SqliteTaskStore`; :mod:`.postgres`: :class:`PostgresTaskStore`
  (with :mod:`.pool`, its fast-path connections).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sendqueue.adapters.sql.base import SqlTaskStore
from sendqueue.adapters.sql.postgres import PostgresTaskStore
from sendqueue.adapters.sql.rows import CHUNK_SIZE
from sendqueue.adapters.sql.schema import normalise_url
from sendqueue.adapters.sql.sqlite import SqliteTaskStore

__all__ = [
    "CHUNK_SIZE",
    "PostgresTaskStore",
    "SqlTaskStore",
    "SqliteTaskStore",
    "open_store",
]


def open_store(
    url: str,
    *,
    upgrade: bool = True,
    engine_options: Mapping[str, Any] | None = None,
    pg_idle_connections: int = 4,
) -> SqlTaskStore:
    """The task store at ``url``: ``sqlite:///path/to/file.db`` or
    ``postgresql+psycopg://user@host:5432/db`` (plain ``postgresql://`` means psycopg 3 too).

    With ``upgrade`` (the default) the schema is migrated to the newest revision on open; pass
    ``upgrade=False`` where ``sendqueue db upgrade`` is run explicitly. ``engine_options`` go to
    :func:`sqlalchemy.create_engine` (e.g. ``pool_size``). On PostgreSQL the hot paths keep up
    to ``pg_idle_connections`` connections of their own open between calls, besides the
    engine's pool. ValueError for a URL of another database.
    """
    if normalise_url(url).get_backend_name() == "sqlite":
        return SqliteTaskStore(url, upgrade=upgrade, engine_options=engine_options)
    return PostgresTaskStore(
        url,
        upgrade=upgrade,
        engine_options=engine_options,
        pg_idle_connections=pg_idle_connections,
    )
