"""The live stream woken on commit on SQLite (sendqueue.adapters.sql.signal): a change written
in this process wakes the reader at once, one written by another process is seen through the
file's data_version, and a client resuming mid-burst still gets every change once.

Every reader here polls once an hour at most (``NO_POLL``), so a change that arrives at all
arrived through the signal; no test measures how fast (that is ``python -m bench --only
stream``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sendqueue.adapters.sql.signal import SqliteWatch
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.bootstrap.stream import change_signal
from sendqueue.domain.lifecycle import TaskState
from sendqueue.web.stream import ChangeBroker, StreamConfig
from tests.web.conftest import FlakyStore, live_server, sqlite_settings
from tests.web.test_stream import SseClient, Stage, _cancel, _log_ids
from tests.web.test_stream_status import Reader, _gen

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600.0
NO_POLL = StreamConfig(
    poll_interval=HOUR,
    idle_poll_interval=HOUR,
    signal_fallback=HOUR,
    heartbeat=HOUR,
    lag_threshold=HOUR,
    status_interval=HOUR,
)


@contextmanager
def signalled(tmp_path: Path, *, watch: bool) -> Iterator[tuple[Container, Stage]]:
    """A container on SQLite files with a provisioned campaign (in a Stage without a server),
    its store's signal watching the file for other processes only when ``watch``."""
    container = bootstrap(sqlite_settings(tmp_path))
    try:
        signal = change_signal(container.store)
        assert isinstance(signal, SqliteWatch)
        signal.watch_interval = 0.01 if watch else HOUR
        yield container, Stage(container, container, FlakyStore(container.store), "", None)
    finally:
        container.close()


async def _until_changes(client: Reader, count: int) -> list[int]:
    async with asyncio.timeout(60):  # a hang guard, far below NO_POLL's hour
        while len(client.changes) < count:
            await client.for_seconds(0.01)
    return client.changes


def test_a_commit_in_this_process_wakes_the_stream_without_a_poll(tmp_path: Path) -> None:
    with signalled(tmp_path, watch=False) as (container, stage):
        cid = stage.campaign(3)
        start = container.store.last_change_id()
        counted = stage.store
        broker = ChangeBroker(counted, NO_POLL, change_signal(container.store))

        async def scenario() -> None:
            sub = await broker.subscribe(cid, None)
            client = Reader(_gen(broker.frames(sub)))
            await client.until("live")
            async with asyncio.timeout(60):
                while counted.reads < 1:  # the reader's first read, at the head
                    await asyncio.sleep(0.01)
            reads = counted.reads
            await asyncio.to_thread(_cancel, container, cid, range(2))
            assert await _until_changes(client, 2) == _log_ids(container, cid, start)
            # Woken by the two commits, not by a poll: a read or two after them, no more.
            assert reads < counted.reads <= reads + 3
            await broker.close()

        asyncio.run(scenario())


def _write_in_another_process(home: Path, cid: str, position: int) -> None:
    code = (
        "import sys; from datetime import UTC, datetime; from pathlib import Path\n"
        "from sendqueue.bootstrap import bootstrap\n"
        "from sendqueue.domain.lifecycle import TaskState\n"
        "from tests.web.conftest import sqlite_settings\n"
        "app = bootstrap(sqlite_settings(Path(sys.argv[1])))\n"
        "assert app.store.transition(sys.argv[2], TaskState.PENDING, TaskState.CANCELLED,"
        " at=datetime.now(UTC)) is not None\n"
        "app.close()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(home), f"{cid}-{position}"],
        cwd=ROOT,
        check=True,
        timeout=120,
    )


def test_a_commit_of_another_process_wakes_the_stream_through_the_file(tmp_path: Path) -> None:
    with signalled(tmp_path, watch=True) as (container, stage):
        cid = stage.campaign(2)
        start = container.store.last_change_id()
        broker = ChangeBroker(container.store, NO_POLL, change_signal(container.store))

        async def scenario() -> None:
            sub = await broker.subscribe(cid, None)
            client = Reader(_gen(broker.frames(sub)))
            await client.until("live")
            await asyncio.to_thread(_write_in_another_process, tmp_path, cid, 1)
            assert await _until_changes(client, 1) == _log_ids(container, cid, start)
            await broker.close()

        asyncio.run(scenario())


def test_the_signal_stops_with_the_last_stream_and_restarts_with_the_next(
    tmp_path: Path,
) -> None:
    with signalled(tmp_path, watch=True) as (container, stage):
        cid = stage.campaign(2)
        signal = change_signal(container.store)
        assert isinstance(signal, SqliteWatch)
        broker = ChangeBroker(container.store, NO_POLL, signal)

        async def scenario() -> None:
            for position in range(2):
                start = container.store.last_change_id()
                sub = await broker.subscribe(cid, None)
                assert signal.listened
                client = Reader(_gen(broker.frames(sub)))
                await client.until("live")
                await asyncio.to_thread(_cancel, container, cid, range(position, position + 1))
                assert await _until_changes(client, 1) == _log_ids(container, cid, start)
                broker.unsubscribe(sub)  # the client goes away
                assert not signal.listened  # the reader left the signal with its last client
            await broker.close()

        asyncio.run(scenario())


@pytest.mark.parametrize("writer_container", ["same", "other"])
def test_resume_mid_burst_over_http_gets_every_change_once(
    tmp_path: Path, writer_container: str
) -> None:
    """The app as ``serve`` builds it (bootstrap's signal), written by the server's container
    or by another one on the same file in this process (both wake the reader)."""
    settings = sqlite_settings(tmp_path)
    server = bootstrap(settings)
    writer = server if writer_container == "same" else bootstrap(settings)
    config = StreamConfig(
        poll_interval=HOUR, idle_poll_interval=HOUR, signal_fallback=HOUR, lag_threshold=HOUR,
        heartbeat=0.5,
    )  # fmt: skip
    try:
        signal = change_signal(server.store)
        assert isinstance(signal, SqliteWatch)
        signal.watch_interval = HOUR  # this process's signal only
        with live_server(server, stream=config) as (base, _app):
            stage = Stage(server, writer, FlakyStore(server.store), base, _app)
            cid = stage.campaign(200)
            start = writer.store.last_change_id()
            watcher = SseClient(stage.url(cid, f"?after={start}"))
            client = SseClient(stage.url(cid, f"?after={start}"))
            burst = threading.Thread(target=_cancel, args=(writer, cid, range(200), 0.002))
            burst.start()
            got = client.events(60)
            client.close()
            resumed = SseClient(stage.url(cid), {"Last-Event-ID": str(got[-1].id)})
            burst.join(60)
            got += resumed.events(140)
            watched = watcher.events(200)
            resumed.close()
            watcher.close()
            expected = _log_ids(writer, cid, start)
            assert len(expected) == 200
            assert [e.id for e in got] == expected  # in order, each once, no gap
            assert [e.id for e in watched] == expected
            assert all(e.data["to"] == TaskState.CANCELLED.value for e in got)
    finally:
        if writer is not server:
            writer.close()
        server.close()
