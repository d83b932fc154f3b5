"""The SQL stores' vendor exceptions, mapped to sendqueue's at the adapter edge.

:func:`mapped_errors` wraps every store call: failures of the database (SQLAlchemy's, the
``sqlite3`` driver's on the SQLite fast paths, psycopg's on the PostgreSQL ones) become
:class:`~sendqueue.domain.errors.StoreUnavailable`; a parameter refused while binding (a naive
datetime) is re-raised as the caller's own TypeError or ValueError.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from sendqueue.domain.errors import StoreUnavailable

try:  # the PostgreSQL fast paths use the driver directly; it is an optional dependency
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - the "postgres" extra not installed
    psycopg = None  # type: ignore[assignment]
    pg_errors = None  # type: ignore[assignment]

__all__ = ["PG_ERRORS", "PG_SESSION_ENDED", "mapped_errors"]

#: psycopg's base error, or nothing without the driver.
PG_ERRORS: tuple[type[Exception], ...] = () if psycopg is None else (psycopg.Error,)

#: Errors after which a statement certainly did not run (or did not commit): the server
#: ended the session (pg_terminate_backend, a shutdown, a restart) before or while running it.
#: A write is retried once on a new connection only after one of these.
PG_SESSION_ENDED: tuple[type[Exception], ...] = (
    ()
    if pg_errors is None
    else (pg_errors.AdminShutdown, pg_errors.CrashShutdown, pg_errors.CannotConnectNow)
)


@contextmanager
def mapped_errors(action: str) -> Iterator[None]:
    """Map the vendor exceptions raised inside to sendqueue's; ``action`` names the call in
    the message (e.g. ``"get task"``)."""
    try:
        yield
    except sa_exc.DBAPIError as exc:
        raise StoreUnavailable(f"task store: {action} failed: {exc.orig}") from exc
    except sa_exc.StatementError as exc:
        # Raised while binding parameters, before the database saw anything: a bad argument
        # (e.g. a naive datetime) from the caller, not an outage.
        if isinstance(exc.orig, TypeError | ValueError):
            raise exc.orig from None
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
    except sa_exc.SQLAlchemyError as exc:
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
    except sqlite3.Error as exc:
        # From statements run on the driver's connection directly (the SQLite fast paths).
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
    except PG_ERRORS as exc:
        # The same on PostgreSQL (psycopg's connection of the PostgreSQL fast paths).
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
