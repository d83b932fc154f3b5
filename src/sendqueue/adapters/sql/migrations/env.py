"""Alembic environment for the task store; driven by :mod:`sendqueue.adapters.sql.migrate`.

There is no ``alembic.ini``: :mod:`sendqueue.adapters.sql.migrate` builds the configuration in
code and hands over an open connection (``config.attributes["connection"]``) whose transaction it
controls, so the migration runs inside the lock it took. For authoring a new revision with the
``alembic`` command, a ``sqlalchemy.url`` main option works too.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql.schema import create_store_engine, metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        if not url:
            raise RuntimeError("offline migrations need the sqlalchemy.url option")
        context.configure(url=url, target_metadata=metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _run(connection)
        return
    if not url:
        raise RuntimeError("pass a connection in config.attributes or set sqlalchemy.url")
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


_main()
