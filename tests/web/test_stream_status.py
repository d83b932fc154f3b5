"""The live stream says "delayed" when its change-log reader fails, hangs or lags the store, and
"live" again when it has caught up; a heartbeat never stands in for that.

The rules (:class:`ReaderHealth`) on explicit times; then the broker over change logs in
memory that fail, hang or hold their entries back, with thresholds of a fraction of a second.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.models import ChangeLogEntry
from sendqueue.web.stream import ChangeBroker, StreamConfig
from sendqueue.web.stream_status import LIVE, ReaderHealth, StreamStatus

T = 5.0  # the threshold of the rules' tests


# -- the rules -------------------------------------------------------------------------------------
def test_a_new_reader_is_live_until_the_threshold_passes_without_a_read() -> None:
    health = ReaderHealth(T, now=100.0)
    assert health.status(100.0 + T) == LIVE
    stalled = health.status(100.0 + T + 0.1)
    assert stalled.key == ("delayed", "stalled")
    assert stalled.lag_seconds == pytest.approx(T + 0.1)


def test_a_failing_store_is_delayed_after_the_threshold_and_live_on_the_first_good_read() -> None:
    health = ReaderHealth(T, now=0.0)
    health.read_ok(1.0, position=10)
    for t in (2.0, 3.0, 5.0, 6.0):
        health.read_failed()
        assert health.status(t) == LIVE  # a blip within the threshold is not a delay
    health.read_failed()
    failing = health.status(6.1)
    assert failing.key == ("delayed", "failing")
    assert failing.lag_seconds == pytest.approx(5.1)
    assert "cannot read" in failing.reason
    health.read_ok(9.0, position=10)
    assert health.status(9.0) == LIVE


def test_a_reader_behind_the_store_is_delayed_once_its_oldest_undelivered_change_is_old() -> None:
    health = ReaderHealth(T, now=0.0)
    health.read_ok(0.0, position=10)
    health.head_seen(0.0, head=12, position=10)  # ids 11 and 12 wait
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        health.read_ok(t, position=10)  # reads succeed, and bring nothing
        health.head_seen(t, head=12, position=10)
        assert health.status(t) == LIVE
    behind = health.status(5.5)
    assert behind.key == ("delayed", "behind")
    assert behind.lag_seconds == pytest.approx(5.5)
    health.read_ok(6.0, position=11)  # one of the two: still behind
    assert health.status(6.0).key == ("delayed", "behind")
    health.read_ok(6.2, position=12)
    assert health.status(6.2) == LIVE


def test_the_lag_runs_from_the_oldest_change_still_undelivered() -> None:
    health = ReaderHealth(T, now=0.0)
    health.head_seen(0.0, head=10, position=0)
    health.head_seen(4.0, head=20, position=0)
    health.read_ok(4.5, position=10)  # the changes seen at 0 s are delivered, not those of 4 s
    assert health.status(8.9) == LIVE
    assert health.status(9.1).key == ("delayed", "behind")
    assert health.status(9.1).lag_seconds == pytest.approx(5.1)
    health.read_ok(9.2, position=20)
    assert health.status(9.2) == LIVE


def test_the_head_at_the_position_clears_the_lag() -> None:
    health = ReaderHealth(T, now=0.0)
    health.head_seen(0.0, head=3, position=0)
    health.head_seen(1.0, head=3, position=3)
    health.read_ok(6.0, position=3)
    assert health.status(6.0) == LIVE


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0.01, 2.0),  # seconds until the next read
            st.integers(0, 50),  # changes written meanwhile
            st.floats(0.0, 1.0),  # where in the read the head is looked at (0: before it)
        ),
        min_size=1,
        max_size=200,
    )
)
def test_a_reader_that_keeps_up_is_never_delayed(steps: list[tuple[float, int, float]]) -> None:
    """Changes written at any pace, each delivered by the next read (reads under 2 s apart):
    never "delayed" with a threshold of 5 s, however long it runs."""
    health = ReaderHealth(T, now=0.0)
    now, head, position = 0.0, 0, 0
    for gap, written, at in steps:
        seen = head + written if at > 0.5 else head  # the head may run ahead of the read
        health.head_seen(now + gap * at, seen, position)
        head += written
        now += gap
        position = head
        health.read_ok(now, position)
        assert health.status(now) == LIVE


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threshold"):
        ReaderHealth(0, now=0.0)


def test_the_status_frame() -> None:
    frame = StreamStatus("delayed", "behind", "the server's live updates are behind", 6.04).frame()
    head, data = frame.removesuffix("\n\n").split("\n")
    assert head == "event: status"
    assert json.loads(data.removeprefix("data: ")) == {
        "state": "delayed",
        "cause": "behind",
        "reason": "the server's live updates are behind",
        "lag_seconds": 6.0,
    }
    assert json.loads(LIVE.frame().split("data: ")[1]) == {
        "state": "live",
        "cause": None,
        "reason": None,
        "lag_seconds": 0.0,
    }


# -- the broker over change logs that misbehave --------------------------------------------------
class FaultyLog:
    """A change log in memory whose whole-log reads (the reader's) can fail, hang or hold
    entries back; ``last_change_id`` always tells the truth, as the store's head would."""

    def __init__(self) -> None:
        self.entries: list[ChangeLogEntry] = []
        self.fail = False
        self.lag = False  # return nothing new
        self.hang = threading.Event()
        self.hang.set()  # set: reads go through

    def add(self, campaign_id: str, n: int = 1) -> None:
        for _ in range(n):
            self.entries.append(
                ChangeLogEntry(
                    len(self.entries) + 1, campaign_id, f"{campaign_id}-1", "Pending",
                    "Cancelled", datetime.now(UTC),
                )
            )  # fmt: skip

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]:
        if campaign_id is None:
            self.hang.wait(10)
            if self.fail:
                raise StoreUnavailable("injected: the database is unreachable")
            if self.lag:
                return []
        found = [
            e for e in self.entries if e.id > after_id and campaign_id in (None, e.campaign_id)
        ]
        return found[:limit]

    def last_change_id(self) -> int:
        return len(self.entries)

    def newest_change_id(self) -> int:
        return len(self.entries)


FAST = StreamConfig(
    poll_interval=0.01, heartbeat=0.05, lag_threshold=0.3, status_interval=0.05, error_backoff=0.05
)


def _gen(frames: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    assert isinstance(frames, AsyncGenerator)
    return frames


class Reader:
    """One subscriber's frames, read by a task of its own and parsed: each status it was
    told, the pings and the change ids. (A timeout around ``anext`` itself would cancel the
    generator, which ends the stream.)"""

    def __init__(self, frames: AsyncGenerator[str, None]) -> None:
        self.frames = frames
        self.statuses: list[dict[str, object]] = []
        self.pings = 0
        self.changes: list[int] = []
        self._new = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        async for text in self.frames:
            for block in text.split("\n\n"):
                self._parse(block)
            self._new.set()

    async def until(self, state: str, timeout: float = 5.0) -> dict[str, object]:
        """Wait for the next status with ``state`` (after those already read); return it."""
        seen = len(self.statuses)
        async with asyncio.timeout(timeout):
            while True:
                for status in self.statuses[seen:]:
                    if status["state"] == state:
                        return status
                seen = len(self.statuses)
                self._new.clear()
                await self._new.wait()

    async def for_seconds(self, seconds: float) -> None:
        """Let frames come for ``seconds``."""
        await asyncio.sleep(seconds)
        assert not self._task.done(), "the stream ended"

    def _parse(self, block: str) -> None:
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if lines.get("event") == "ping":
            self.pings += 1
        elif lines.get("event") == "change":
            self.changes.append(int(lines["id"]))
        elif lines.get("event") == "status":
            self.statuses.append(json.loads(lines["data"]))


def _broker(log: FaultyLog) -> ChangeBroker:
    return ChangeBroker(log, FAST)


def test_the_first_frame_says_live_and_a_failing_log_turns_it_delayed_then_live() -> None:
    log = FaultyLog()
    broker = _broker(log)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        first = await anext(_gen(broker.frames(sub)))
        assert first.startswith("retry:")
        assert 'event: status\ndata: {"state":"live"' in first
        await broker.close()

    asyncio.run(scenario())

    log = FaultyLog()
    broker = _broker(log)

    async def failing() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        assert await client.until("live") == {
            "state": "live",
            "cause": None,
            "reason": None,
            "lag_seconds": 0.0,
        }
        log.fail = True
        delayed = await client.until("delayed")
        assert delayed["cause"] == "failing"
        assert isinstance(delayed["lag_seconds"], float) and delayed["lag_seconds"] >= 0.3
        assert broker.status().key == ("delayed", "failing")
        # pings keep coming while the log fails, and none of them makes it live
        pings = client.pings
        await client.for_seconds(0.5)
        assert client.pings > pings
        assert [s["state"] for s in client.statuses] == ["live", "delayed"]
        # a client that joins now is told at once
        late = await broker.subscribe("c1", None)
        assert '"state":"delayed"' in await anext(_gen(broker.frames(late)))
        log.fail = False
        log.add("c1")
        assert (await client.until("live"))["cause"] is None
        await client.for_seconds(0.2)
        assert client.changes == [1]
        await broker.close()

    asyncio.run(failing())


def test_a_log_that_holds_changes_back_is_delayed_until_they_arrive() -> None:
    log = FaultyLog()
    broker = _broker(log)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        await client.until("live")
        log.lag = True  # reads succeed, but bring nothing of what is written
        log.add("c1", 3)
        delayed = await client.until("delayed")
        assert delayed["cause"] == "behind"
        assert client.changes == []
        log.lag = False
        await client.until("live")
        await client.for_seconds(0.1)
        assert client.changes == [1, 2, 3]
        await broker.close()

    asyncio.run(scenario())


def test_a_quiet_log_that_keeps_up_stays_live() -> None:
    log = FaultyLog()
    broker = _broker(log)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        await client.until("live")
        for _ in range(10):
            log.add("c1")
            await client.for_seconds(0.1)
        assert client.changes == list(range(1, 11))
        assert [s["state"] for s in client.statuses] == ["live"]
        assert client.pings > 0
        await broker.close()

    asyncio.run(scenario())


def test_a_read_that_hangs_is_delayed_while_it_hangs() -> None:
    log = FaultyLog()
    broker = _broker(log)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        await client.until("live")
        log.hang.clear()  # the next read blocks in its thread
        try:
            delayed = await client.until("delayed")
        finally:
            log.hang.set()
        assert delayed["cause"] == "stalled"
        await client.until("live")
        await broker.close()

    asyncio.run(scenario())
