"""A send costs two store round trips (the claim and the finish), on SQLite and on
PostgreSQL, with and without a sender: counted at the driver, every statement and transaction
the store sends while the worker handles one invocation.

SQLite: each connection's trace callback sees every statement; a transaction (``BEGIN`` ...
``COMMIT``) counts once, a statement outside one once. PostgreSQL: every statement a psycopg
cursor executes counts (the fast path runs in autocommit, so each is its own transaction), and
every transaction the engine begins counts too. The first send of the campaign is not counted:
it fills the worker's caches (the campaign and the sender, kept a second).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sendqueue.adapters.sql import PostgresTaskStore, SqliteTaskStore
from sendqueue.adapters.sql.base import SqlTaskStore
from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskState
from sendqueue.services.scheduling.schedules import send_payload
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.support.app import T0, csv_bytes, fake_app, open_policy

SENDS = 5


class RoundTrips:
    """Counts what reaches the database (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self._in_transaction: dict[int, bool] = {}
        self._lock = threading.Lock()

    def traced(self, db: sqlite3.Connection) -> None:
        key = id(db)

        def trace(statement: str) -> None:
            word = statement.lstrip().split(" ", 1)[0].upper()
            with self._lock:
                if word == "BEGIN":
                    self.count += 1
                    self._in_transaction[key] = True
                elif word in {"COMMIT", "ROLLBACK", "END"}:
                    self._in_transaction[key] = False
                elif not self._in_transaction.get(key, False):
                    self.count += 1

        db.set_trace_callback(trace)

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.count += n


def _counting_cursor(counter: RoundTrips) -> type:
    import psycopg

    class Counting(psycopg.Cursor):
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            counter.add()
            return super().execute(*args, **kwargs)

    return Counting


def _app(store: SqlTaskStore, sender: bool) -> tuple[Container, str, FakeClock]:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, store=store, mailer=RecordingMailer())
    senders = []
    if sender:
        senders = [app.senders.add(email="anna@example.com", name="Anna", daily_cap=1000).id]
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(SENDS + 2), policy=open_policy(), senders=senders
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return app, cid, clock


def _count_sends(
    store: SqlTaskStore, sender: bool, instrument: Callable[[RoundTrips], None]
) -> list[int]:
    """Round trips of each counted send, sent from a thread of its own (new connections)."""
    app, cid, clock = _app(store, sender)
    tasks = sorted(store.list_tasks(cid, limit=100), key=lambda t: t.send_at)
    counter = RoundTrips()
    instrument(counter)
    per_send: list[int] = []

    def send_all() -> None:
        for i, task in enumerate(tasks[: SENDS + 1]):
            clock.set(task.send_at)
            before = counter.count
            app.worker.send(send_payload(task))
            if i:  # the first fills the worker's caches
                per_send.append(counter.count - before)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(send_all).result()
    done = store.list_tasks(cid, state=TaskState.FINISHED, limit=100)
    assert len(done) == SENDS + 1
    if sender:
        assert all(t.sender_id is not None for t in done)
    return per_send


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteTaskStore]:
    store = SqliteTaskStore(f"sqlite:///{tmp_path / 'store.db'}")
    yield store
    store.close()


@pytest.mark.parametrize("sender", [False, True], ids=["plain", "sender"])
def test_a_send_is_two_transactions_on_sqlite(sqlite_store: SqliteTaskStore, sender: bool) -> None:
    def instrument(counter: RoundTrips) -> None:
        engine = sqlite_store.engine
        sa.event.listen(engine, "connect", lambda db, _record: counter.traced(db))
        engine.dispose()  # every connection from here on is a new, traced one

    assert _count_sends(sqlite_store, sender, instrument) == [2] * SENDS


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[PostgresTaskStore]:
    store = PostgresTaskStore(postgres_url)
    yield store
    store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("sender", [False, True], ids=["plain", "sender"])
def test_a_send_is_two_statements_on_postgres(pg_store: PostgresTaskStore, sender: bool) -> None:
    def instrument(counter: RoundTrips) -> None:
        engine = pg_store.engine
        cursor = _counting_cursor(counter)

        def connected(db: Any, _record: object) -> None:
            db.cursor_factory = cursor

        sa.event.listen(engine, "connect", connected)
        sa.event.listen(engine, "begin", lambda _conn: counter.add())
        pg_store._connections.close()  # the fast path's idle connections go: new ones counted
        engine.dispose()

    assert _count_sends(pg_store, sender, instrument) == [2] * SENDS
