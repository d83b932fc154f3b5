"""The live stream woken by LISTEN/NOTIFY on PostgreSQL (migration 0011 and
sendqueue.adapters.sql.signal.PgListener).

Every reader here polls once an hour at most (``NO_POLL``), so a change that arrives at all
arrived through a notification (or the listener's catch-up wake after it reconnected); no
test measures how fast (that is ``python -m bench --only stream``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from sendqueue.adapters.sql import PostgresTaskStore
from sendqueue.adapters.sql.signal import CHANNEL, PgListener
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import task_id
from sendqueue.web.stream import ChangeBroker, StreamConfig
from tests.integration.test_pg_change_log import _campaign, _everything, _psycopg_url, store
from tests.support.app import T0
from tests.web.test_stream_status import Reader, _gen

pytestmark = pytest.mark.postgres

__all__ = ["store"]  # the fixture, shared with test_pg_change_log

HOUR = 3600.0
NO_POLL = StreamConfig(
    poll_interval=HOUR,
    idle_poll_interval=HOUR,
    signal_fallback=HOUR,
    heartbeat=HOUR,
    lag_threshold=HOUR,
    status_interval=HOUR,
)
_LOG = (
    "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at)"
    " SELECT 'c1', NULL, NULL, 'progress', now() WHERE %s"
)


async def _until(test: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(60):  # a hang guard, far below NO_POLL's hour
        while not test():
            await asyncio.sleep(0.01)
    assert test(), what


def _cancel(url: str, cid: str, positions: range) -> None:
    """Cancel tasks through another store (its own connections), one commit each."""
    writer = PostgresTaskStore(url, upgrade=False)
    try:
        for position in positions:
            moved = writer.transition(
                task_id(cid, position), TaskState.PENDING, TaskState.CANCELLED, at=T0
            )
            assert moved is not None
    finally:
        writer.close()


def test_the_trigger_notifies_once_per_transaction_that_logged(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    _campaign(store, "c1", 1)
    url = _psycopg_url(postgres_url)
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url) as writer:
        listener.execute(f"LISTEN {CHANNEL}")
        writer.execute(_LOG, (True,))
        writer.execute(_LOG, (True,))
        writer.commit()  # two statements that logged: one notification
        writer.execute(_LOG, (False,))
        writer.commit()  # a statement that logged nothing: none
        writer.execute(_LOG, (True,))
        writer.rollback()  # rolled back: none
        writer.execute("SELECT pg_notify(%s, 'end')", (CHANNEL,))
        writer.commit()
        payloads: list[str] = []
        for notice in listener.notifies(timeout=60):
            payloads.append(notice.payload)
            if notice.payload == "end":
                break
    assert payloads == ["", "end"]


def test_a_committed_change_reaches_the_stream_through_notify(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    _campaign(store, "c1", 3)
    start = store.last_change_id()
    signal = store.change_signal
    broker = ChangeBroker(store, NO_POLL, signal)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        await client.until("live")
        await _until(lambda: signal.backend_pid is not None, "the store to listen")
        await asyncio.to_thread(_cancel, postgres_url, "c1", range(3))
        await _until(lambda: len(client.changes) >= 3, "three changes")
        assert client.changes == [e.id for e in _everything(store, start, "c1")]
        await broker.close()
        await _until(lambda: signal.backend_pid is None, "the listener to stop")

    asyncio.run(scenario())


def test_a_dropped_listener_reconnects_and_the_stream_catches_up_without_gap(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    _campaign(store, "c1", 6)
    start = store.last_change_id()
    url = _psycopg_url(postgres_url)
    reachable = threading.Event()
    reachable.set()

    def connect() -> Any:
        if not reachable.is_set():
            raise psycopg.OperationalError("injected: the database is unreachable")
        return psycopg.connect(url)

    listener = PgListener(connect, max_backoff=0.2)
    broker = ChangeBroker(store, NO_POLL, listener)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        await client.until("live")
        await _until(lambda: listener.backend_pid is not None, "the listener to listen")
        await asyncio.to_thread(_cancel, postgres_url, "c1", range(2))
        await _until(lambda: len(client.changes) >= 2, "two changes")
        # The listening connection drops, and cannot come back for a while.
        reachable.clear()
        dropped = listener.backend_pid
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (dropped,))
        await _until(lambda: listener.backend_pid is None, "the drop to be noticed")
        # Committed while nobody listens: no notification reaches this process.
        await asyncio.to_thread(_cancel, postgres_url, "c1", range(2, 6))
        reachable.set()
        await _until(lambda: len(client.changes) >= 6, "the changes made while down")
        assert listener.connections == 2
        assert listener.backend_pid not in (None, dropped)
        assert client.changes == [e.id for e in _everything(store, start, "c1")]  # no gap, once
        await _until(lambda: len(client.changes) >= 6, "nothing else")
        await broker.close()
        listener.close()

    asyncio.run(scenario())
