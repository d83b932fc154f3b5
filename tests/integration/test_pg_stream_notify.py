"""The live stream woken by LISTEN/NOTIFY on PostgreSQL (sendqueue.adapters.sql.signal:
PgNotifier after each write of a store, PgListener in the reading process).

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
from sendqueue.adapters.sql.signal import CHANNEL, PgListener, PgNotifier
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


def test_the_notifier_folds_pokes_and_sends_what_it_was_poked_for_before_closing(
    postgres_url: str,
) -> None:
    url = _psycopg_url(postgres_url)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        notifier = PgNotifier(lambda: psycopg.connect(url, autocommit=True))
        for _ in range(50):
            notifier.poke()
        notifier.close()
        notifier.poke()  # closed: ignored
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, 'end')", (CHANNEL,))
        payloads = []
        for notice in listener.notifies(timeout=60):
            payloads.append(notice.payload)
            if notice.payload == "end":
                break
    # Everything poked for was sent before close() returned, so before the marker.
    assert payloads[-1] == "end"
    assert payloads[:-1] == [""] * notifier.sent
    assert 1 <= notifier.sent <= 50


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
        # The stream may already hold them (a read that found entries held back by an open
        # transaction reads again later); either way the listener comes back and wakes readers.
        await _until(lambda: listener.connections == 2, "the listener to reconnect")
        assert listener.backend_pid not in (None, dropped)
        await _until(lambda: len(client.changes) >= 6, "the changes made while down")
        assert client.changes == [e.id for e in _everything(store, start, "c1")]  # no gap, once
        await _until(lambda: len(client.changes) >= 6, "nothing else")
        await broker.close()
        listener.close()

    asyncio.run(scenario())
