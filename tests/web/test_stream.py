"""The live event stream over real sockets: a uvicorn server on 127.0.0.1 in a thread, the
changes written by another Container on the same SQLite files (as another process would)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import ChangeLogEntry
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.web.stream import ChangeBroker, StreamConfig
from tests.support.app import csv_bytes, open_policy
from tests.support.real import running_worker, wait_until
from tests.web.conftest import FlakyStore, live_server, sqlite_settings

ROOT = Path(__file__).resolve().parents[2]
FAST = StreamConfig(poll_interval=0.1, heartbeat=0.3)


@dataclass
class Event:
    id: int
    data: dict[str, Any]


@dataclass
class SseClient:
    """A minimal EventSource: reads frames, keeps the last event id, counts comments."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    last_id: int | None = None
    comments: list[str] = field(default_factory=list)
    pings: int = 0
    retry: int | None = None

    def __post_init__(self) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=5.0))
        self._cm = self._client.stream("GET", self.url, headers=self.headers)
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self._lines = self.response.iter_lines()

    def frame(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        for line in self._lines:
            if line == "":
                if "id" in fields:
                    self.last_id = int(fields["id"])
                if fields.get("event") == "ping":
                    assert fields == {"event": "ping", "data": "{}"}
                    self.pings += 1
                return fields
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            if name == "retry":
                self.retry = int(fields[name])
        raise EOFError("the stream ended")

    def events(self, count: int, timeout: float = 15.0) -> list[Event]:
        out: list[Event] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(out)} of {count} events in {timeout}s")
            fields = self.frame()
            if fields.get("event") == "change":
                out.append(Event(int(fields["id"]), json.loads(fields["data"])))
        return out

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self._client.close()


@dataclass
class Stage:
    """The server's container (its store counted), a writer on the same files, the URL."""

    server: Container
    writer: Container
    store: FlakyStore
    base: str
    app: Any

    @property
    def broker(self) -> ChangeBroker:
        broker: ChangeBroker = self.app.state.broker
        return broker

    def campaign(self, count: int) -> str:
        """A provisioned campaign whose sends are far away (so nothing sends by itself)."""
        far = datetime.now(UTC) + timedelta(days=30)
        created = self.writer.campaign_import.create(
            name="s", recipients=csv_bytes(count), policy=open_policy(far)
        )
        cid = created.campaign.id
        assert self.writer.provisioner.provision(cid).status == "done"
        return cid

    def url(self, cid: str, query: str = "") -> str:
        return f"{self.base}/api/campaigns/{cid}/events{query}"


@contextmanager
def stage(tmp_path: Path, stream: StreamConfig = FAST, **overrides: Any) -> Iterator[Stage]:
    settings = sqlite_settings(tmp_path, **overrides)
    writer = bootstrap(settings)
    writer.store.last_change_id()  # creates the schema before the server opens the files
    counted = FlakyStore(bootstrap(settings).store)
    server = bootstrap(settings, store=counted)
    try:
        with live_server(server, stream=stream) as (base, app):
            yield Stage(server, writer, counted, base, app)
    finally:
        server.close()
        writer.close()
        counted.inner.close()


def _cancel(writer: Container, cid: str, positions: range, pause: float = 0.0) -> list[float]:
    """Cancel tasks one by one (each a logged change); returns when each was written."""
    written: list[float] = []
    for position in positions:
        done = writer.store.transition(
            f"{cid}-{position}", TaskState.PENDING, TaskState.CANCELLED, at=datetime.now(UTC)
        )
        assert done is not None
        written.append(time.monotonic())
        if pause:
            time.sleep(pause)
    return written


def _log_ids(writer: Container, cid: str, after: int) -> list[int]:
    ids: list[int] = []
    while True:
        batch = writer.store.changes_after(after, campaign_id=cid, limit=1000)
        ids += [e.id for e in batch]
        if len(batch) < 1000:
            return ids
        after = batch[-1].id


def test_events_from_a_worker_in_another_container_arrive_within_a_second(
    tmp_path: Path,
) -> None:
    with stage(tmp_path, mailer=f"maildir:{tmp_path / 'outbox'}", retry_backoff=0.5) as st:
        now = datetime.now(UTC)
        count = 10
        created = st.writer.campaign_import.create(
            name="live",
            recipients=demo_csv(count),
            policy=demo_policy(now, "UTC", count, 0.2),
            templates=Templates(subject="Hi {{ name }}", body="Hello {{ city }}"),
        )
        cid = created.campaign.id
        client = SseClient(st.url(cid))
        first = client.frame()
        assert client.retry == FAST.retry_ms
        assert int(first["id"]) == st.writer.store.last_change_id()
        assert st.writer.provisioner.provision(cid).status == "done"
        # per task: created, claimed, sent (Pending is logged on insert)
        expected = count * 3
        latencies: list[float] = []
        seen: list[tuple[str | None, str | None, str]] = []
        with running_worker(st.writer):
            deadline = time.monotonic() + 30
            while sum(1 for s in seen if s[0]) < expected:
                assert time.monotonic() < deadline, f"events seen: {len(seen)}"
                for event in client.events(1):
                    arrived = datetime.now(UTC)
                    data = event.data
                    assert data["id"] == event.id
                    assert data["campaign_id"] == cid
                    seen.append((data["task_id"], data["from"], data["to"]))
                    if data["task_id"] and data["to"] in {"Running", "Finished"}:
                        at = datetime.fromisoformat(data["at"].replace("Z", "+00:00"))
                        latencies.append((arrived - at).total_seconds())
        client.close()
        tasks = {f"{cid}-{i}" for i in range(count)}
        for to, frm in (("Pending", None), ("Running", "Pending"), ("Finished", "Running")):
            assert {s[0] for s in seen if s[2] == to and s[1] == frm} == tasks
        assert ("progress" in {s[2] for s in seen}) and ("active" in {s[2] for s in seen})
        latencies.sort()
        print(
            f"\nstream latency (change written -> event parsed by the client), "
            f"{len(latencies)} events: median {statistics.median(latencies) * 1000:.0f} ms, "
            f"p90 {latencies[int(len(latencies) * 0.9)] * 1000:.0f} ms, "
            f"max {latencies[-1] * 1000:.0f} ms (poll interval {FAST.poll_interval * 1000:.0f} ms)"
        )
        # The requirement is "within a second"; the reader polls every 100 ms here.
        assert latencies[-1] < 1.0


def test_resume_after_a_disconnect_mid_burst_gets_every_change_once(tmp_path: Path) -> None:
    with stage(tmp_path) as st:
        cid = st.campaign(300)
        start = st.writer.store.last_change_id()
        # A second client keeps the campaign's reader running and ahead, so the resumed
        # client has to read its backlog from the store and then join the live feed.
        watcher = SseClient(st.url(cid, f"?after={start}"))
        client = SseClient(st.url(cid, f"?after={start}"))
        burst = threading.Thread(target=_cancel, args=(st.writer, cid, range(300), 0.002))
        burst.start()
        got = client.events(100)
        client.close()
        watched = watcher.events(150)
        assert watched[-1].id > got[-1].id  # the reader moved on while the client was away
        resumed = SseClient(st.url(cid, f"?after={start}"), {"Last-Event-ID": str(got[-1].id)})
        burst.join(30)
        got += resumed.events(200)
        watched += watcher.events(150)
        resumed.close()
        watcher.close()
        ids = [e.id for e in got]
        expected = _log_ids(st.writer, cid, start)
        assert len(expected) == 300
        assert ids == expected  # in order, each once, no gap
        assert [e.id for e in watched] == expected
        assert {e.data["task_id"] for e in got} == {f"{cid}-{i}" for i in range(300)}
        assert all(e.data["to"] == "Cancelled" for e in got)


@pytest.mark.postgres
def test_resume_on_postgresql(tmp_path: Path, postgres_url: str) -> None:
    with stage(tmp_path, database_url=postgres_url) as st:
        cid = st.campaign(60)
        start = st.writer.store.last_change_id()
        client = SseClient(st.url(cid))
        burst = threading.Thread(target=_cancel, args=(st.writer, cid, range(60), 0.002))
        burst.start()
        got = client.events(20)
        client.close()
        burst.join(30)
        resumed = SseClient(st.url(cid), {"Last-Event-ID": str(got[-1].id)})
        got += resumed.events(40)
        resumed.close()
        assert [e.id for e in got] == _log_ids(st.writer, cid, start)


def test_fifty_clients_share_one_reader(tmp_path: Path) -> None:
    clients_n, changes = 50, 40
    with stage(tmp_path, StreamConfig(poll_interval=0.1, heartbeat=0.5)) as st:
        cid = st.campaign(changes)
        results: dict[int, list[int]] = {}
        errors: list[BaseException] = []
        ready = threading.Barrier(clients_n + 1)

        def listen(n: int) -> None:
            try:
                client = SseClient(st.url(cid))
                client.frame()
                ready.wait(30)
                results[n] = [e.id for e in client.events(changes, timeout=30)]
                client.close()
            except BaseException as exc:
                errors.append(exc)
                ready.abort()

        threads = [threading.Thread(target=listen, args=(n,)) for n in range(clients_n)]
        for thread in threads:
            thread.start()
        ready.wait(30)
        assert st.broker.readers() == {cid: clients_n}
        start = st.writer.store.last_change_id()
        reads_before = st.store.reads
        started = time.monotonic()
        _cancel(st.writer, cid, range(changes), pause=0.01)
        for thread in threads:
            thread.join(60)
        elapsed = time.monotonic() - started
        reads = st.store.reads - reads_before
        assert not errors, errors[0]
        expected = _log_ids(st.writer, cid, start)
        assert len(expected) == changes
        assert all(ids == expected for ids in results.values())
        assert len(results) == clients_n
        # One reader polls every 100 ms: about elapsed / 0.1 reads, not fifty times that.
        print(f"\n{clients_n} clients, {elapsed:.2f} s: {reads} changes_after calls")
        assert reads <= elapsed / 0.1 + 5
        wait_until(lambda: st.broker.readers() == {} and st.broker.clients == 0, 10)


def test_fifty_campaigns_watched_cost_one_read_per_poll(tmp_path: Path) -> None:
    campaigns = 50
    with stage(tmp_path, StreamConfig(poll_interval=0.1, heartbeat=5.0)) as st:
        ids = [st.campaign(1) for _ in range(campaigns)]
        clients = [SseClient(st.url(cid)) for cid in ids]
        for client in clients:
            client.frame()
        assert st.broker.readers() == dict.fromkeys(ids, 1)
        reads_before, started = st.store.reads, time.monotonic()
        time.sleep(2.0)
        # One change on each of three campaigns reaches their clients, and only theirs.
        _cancel(st.writer, ids[0], range(1))
        _cancel(st.writer, ids[7], range(1))
        _cancel(st.writer, ids[49], range(1))
        for n in (0, 7, 49):
            (event,) = clients[n].events(1, timeout=5)
            assert event.data["campaign_id"] == ids[n]
        reads = st.store.reads - reads_before
        elapsed = time.monotonic() - started
        print(f"\n{campaigns} campaigns watched, {elapsed:.2f} s: {reads} changes_after calls")
        # One reader for every campaign: about elapsed / 0.1 reads, not fifty times that.
        assert reads <= elapsed / 0.1 + 5
        for client in clients:
            client.close()
        wait_until(lambda: st.broker.readers() == {} and st.broker.clients == 0, 10)


def test_heartbeats_keep_an_idle_stream_open(tmp_path: Path) -> None:
    with stage(tmp_path, StreamConfig(poll_interval=0.1, heartbeat=0.2)) as st:
        cid = st.campaign(1)
        client = SseClient(st.url(cid))
        assert client.response.headers["content-type"].startswith("text/event-stream")
        assert client.response.headers["cache-control"] == "no-cache"
        assert client.response.headers["x-accel-buffering"] == "no"
        client.frame()
        started = time.monotonic()
        while client.pings < 3:
            client.frame()
        assert time.monotonic() - started < 5
        assert client.last_id == st.writer.store.last_change_id()  # a ping has no id
        client.close()
        wait_until(lambda: st.broker.readers() == {}, 10, "the reader to stop")


def test_too_many_clients_are_refused_with_503(tmp_path: Path) -> None:
    with stage(tmp_path, StreamConfig(poll_interval=0.1, heartbeat=0.5, max_clients=2)) as st:
        cid = st.campaign(1)
        first, second = SseClient(st.url(cid)), SseClient(st.url(cid))
        response = httpx.get(st.url(cid), timeout=5)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        assert "polling" in response.json()["error"]["message"]
        first.close()
        wait_until(lambda: st.broker.clients == 1, 10)
        third = SseClient(st.url(cid))
        third.close()
        second.close()


class _Log:
    """A change log in memory, enough for the broker."""

    def __init__(self) -> None:
        self.entries: list[ChangeLogEntry] = []
        self.calls: list[tuple[int, str | None]] = []

    def add(self, campaign_id: str, n: int) -> None:
        for _ in range(n):
            self.entries.append(
                ChangeLogEntry(
                    len(self.entries) + 1, campaign_id, f"{campaign_id}-1", "Pending",
                    "Running", datetime.now(UTC),
                )
            )  # fmt: skip

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]:
        self.calls.append((after_id, campaign_id))
        found = [
            e for e in self.entries if e.id > after_id and campaign_id in (None, e.campaign_id)
        ]
        return found[:limit]

    def last_change_id(self) -> int:
        return len(self.entries)

    def newest_change_id(self) -> int:
        return len(self.entries)


def test_a_client_that_does_not_read_is_dropped_not_buffered() -> None:
    log = _Log()
    broker = ChangeBroker(log, StreamConfig(poll_interval=0.01, queue_size=5))

    async def scenario() -> None:
        slow = await broker.subscribe("c1", None)
        fast = await broker.subscribe("c1", None)
        frames = broker.frames(fast)
        assert isinstance(frames, AsyncGenerator)
        assert (await anext(frames)).startswith("retry:")
        log.add("c1", 3)
        assert (await anext(frames)).count("event: change") == 3
        log.add("c1", 4)  # the slow one now has 7 waiting, the fast one 4
        for _ in range(100):
            if slow.closed:
                break
            await asyncio.sleep(0.01)
        assert slow.closed
        assert slow.reason == "overflow"
        assert slow.queue.qsize() <= 5
        slow_frames = broker.frames(slow)
        assert (await anext(slow_frames)).startswith("retry:")
        with pytest.raises(StopAsyncIteration):
            await anext(slow_frames)  # ends at once: the client reconnects and resumes
        assert broker.readers() == {"c1": 1}
        await frames.aclose()
        assert broker.readers() == {}
        assert broker.clients == 0
        await broker.close()

    asyncio.run(scenario())


def test_serve_stops_on_sigterm_with_a_stream_open(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=f"maildir:{tmp_path / 'outbox'}",
        PYTHONPATH=str(ROOT / "src"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sendqueue.cli", "serve", "--port", "0"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = ""
        while "sendqueue is serving" not in line:
            line = proc.stdout.readline()
            assert line, "serve exited without printing its URL"
        assert "sendqueue is serving http://127.0.0.1:" in line, line
        assert "worker: embedded" in line
        base = line.split("serving ", 1)[1].split()[0].rstrip("/")
        created = httpx.post(
            f"{base}/api/campaigns",
            json={"name": "x", "recipients": [{"email": "a@example.com"}],
                  "templates": {"subject": "s", "body": "b"}},
        )  # fmt: skip
        assert created.status_code == 201
        client = SseClient(f"{base}/api/campaigns/{created.json()['id']}/events")
        client.frame()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - started < 15
        with pytest.raises((EOFError, httpx.HTTPError)):
            _read_to_the_end(client)
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def _read_to_the_end(client: SseClient) -> None:
    while True:
        client.frame()


def _gen(frames: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    assert isinstance(frames, AsyncGenerator)
    return frames


async def _drain(frames: AsyncIterator[str], count: int) -> list[int]:
    """The ids of the next ``count`` change events a subscriber's frames carry."""
    ids: list[int] = []
    while len(ids) < count:
        text = await asyncio.wait_for(anext(frames), 5)
        ids += [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    return ids


def test_a_resumed_client_reads_its_backlog_then_joins_the_fan_out_without_gap() -> None:
    log = _Log()
    broker = ChangeBroker(log, StreamConfig(poll_interval=0.01, batch=4))

    async def scenario() -> None:
        log.add("c1", 3)
        log.add("c2", 50)  # another campaign's history, which no reader should go through
        watcher = await broker.subscribe("c1", None)
        watching = _gen(broker.frames(watcher))
        await anext(watching)
        log.add("c1", 10)  # the reader moves on past these
        ahead = await _drain(watching, 10)
        assert ahead == list(range(54, 64))
        log.calls.clear()
        # A client that saw only the first c1 change resumes while changes keep coming.
        resumed = await broker.subscribe("c1", 1)
        assert resumed.backlog_after == 1
        frames = _gen(broker.frames(resumed))
        assert (await anext(frames)).startswith("retry:")
        log.add("c1", 5)
        log.add("c2", 7)
        log.add("c1", 5)
        got = await _drain(frames, 2 + 10 + 10)
        c1 = [e.id for e in log.entries if e.campaign_id == "c1"]
        assert got == c1[1:]  # every c1 change after id 1, each once, in order
        assert await _drain(watching, 10) == c1[13:]
        # The backlog is read per campaign, the live feed by one reader over the whole log.
        assert {cid for _, cid in log.calls} == {"c1", None}
        assert min(after for after, cid in log.calls if cid is None) >= 63
        await frames.aclose()
        await watching.aclose()
        assert broker.readers() == {}
        await broker.close()

    asyncio.run(scenario())


def test_a_new_reader_starts_at_the_head_of_the_log() -> None:
    log = _Log()
    broker = ChangeBroker(log, StreamConfig(poll_interval=0.01))

    async def scenario() -> None:
        log.add("c1", 2)
        log.add("c2", 1000)
        sub = await broker.subscribe("c1", 0)  # resumes from the very start
        frames = _gen(broker.frames(sub))
        await anext(frames)
        assert await _drain(frames, 2) == [1, 2]
        # The one reader read from the head (1002), not through c2's thousand entries.
        assert any(cid is None for _, cid in log.calls)
        assert all(after >= 1002 for after, cid in log.calls if cid is None)
        await frames.aclose()
        await broker.close()

    asyncio.run(scenario())


def test_the_reader_polls_less_once_the_log_is_quiet_and_still_delivers() -> None:
    log = _Log()
    config = StreamConfig(poll_interval=0.01, idle_poll_interval=0.1, idle_after=0.2)
    broker = ChangeBroker(log, config)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        frames = _gen(broker.frames(sub))
        await anext(frames)
        await asyncio.sleep(0.4)  # quiet for longer than idle_after
        log.calls.clear()
        await asyncio.sleep(1.0)
        quiet_reads = len(log.calls)
        assert quiet_reads <= 1.0 / 0.1 + 2  # not 1.0 / 0.01
        log.add("c1", 1)
        started = time.monotonic()
        assert await _drain(frames, 1) == [1]
        assert time.monotonic() - started < 0.1 + 0.1
        await frames.aclose()
        await broker.close()

    asyncio.run(scenario())
