"""The live event stream: a campaign's change log as Server-Sent Events.

How it holds the promises of docs/api.md:

- **One reader per process.** :class:`ChangeBroker` runs one asyncio task, while any client is
  connected, that reads the whole change log (``store.changes_after(position)``, every
  campaign at once) and fans each entry out by campaign id to the bounded queues of that
  campaign's subscribers; a campaign nobody watches gets nothing. It stops with the last
  client. The store is reached through a worker thread, so the event loop never blocks on it.
  Because it reads the change log, it sees what workers in other processes write.
- **Woken on commit.** With the store's :class:`~sendqueue.ports.changes.ChangeSignal` (the
  SQL stores: in-process wake and a watch of the file on SQLite, LISTEN/NOTIFY on PostgreSQL)
  the reader reads when a commit is signalled (at once again after a full batch, or when the
  signal came during the read), and every ``signal_fallback`` seconds besides, in case a
  signal is lost. Without one (DynamoDB) it polls: every ``poll_interval`` while changes flow,
  every ``idle_poll_interval`` after ``idle_after`` seconds without one.
- **No gap, no duplicate.** A subscriber joins the reader's fan-out *first*, then, if it asked
  to resume from an id older than the reader's position, reads that backlog (its campaign's
  entries only) from the store itself, and finally takes the live feed. Everything newer
  than its position reaches it through one path or the other (the reader delivers every entry
  above the position it had when the subscriber joined; the backlog read runs until the log
  is exhausted, past that position), and anything it has already sent (id at or below its
  last id) is skipped. The store makes change-log ids visible in id order (see
  ``PostgresTaskStore._log``), so a position never skips an entry that commits later.
- **Bounded memory.** A subscriber whose queue is full (a client that does not read) is
  disconnected; it resumes with ``Last-Event-ID`` from the store, losing nothing. The number
  of clients per process is capped (:class:`TooManyClients`).
- **Liveness.** A ``ping`` event (no ``id``, data ``{}``) every ``heartbeat`` seconds of
  silence keeps idle connections open and tells a client that hears nothing for longer that
  the stream is stale. The first frame sets
  the client's last event id to the position it starts from, so even a client that saw no
  event resumes from there.
- **Progress, not only liveness.** A ping says the connection is open, not that changes still
  arrive. The first frame also carries a ``status`` event, and another one goes to every
  client whenever the reader turns ``delayed`` (failing, stalled, or behind the store for
  longer than ``lag_threshold``) or ``live`` again (:mod:`sendqueue.web.stream_status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.to_thread
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from sendqueue.domain.models import ChangeLogEntry
from sendqueue.services.reading.changes import ChangeLog, ChangeSignal
from sendqueue.services.reading.views import change_dict
from sendqueue.web.stream_status import LIVE, ReaderHealth, StreamStatus

__all__ = [
    "PING",
    "ChangeBroker",
    "EventStreamResponse",
    "StreamConfig",
    "StreamStatus",
    "Subscription",
    "TooManyClients",
    "format_event",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamConfig:
    """Tuning of the live stream (the defaults suit production; tests shorten the times)."""

    poll_interval: float = 0.2
    """Seconds between two reads of the change log while changes flow."""
    idle_poll_interval: float = 0.5
    """Seconds between two reads once the log has been quiet for ``idle_after`` seconds (the
    first change after a quiet spell waits up to this long; never below ``poll_interval``)."""
    idle_after: float = 5.0
    """Seconds without a change after which the reader polls at ``idle_poll_interval``."""
    heartbeat: float = 15.0
    """Seconds of silence after which a ``ping`` event is sent."""
    batch: int = 500
    """Change-log entries per read."""
    queue_size: int = 5000
    """Entries a subscriber may have waiting; a client further behind is disconnected."""
    max_clients: int = 1000
    """Streams open at once in this process; more are refused (503)."""
    retry_ms: int = 2000
    """The reconnection delay suggested to browsers (the SSE ``retry`` field)."""
    error_backoff: float = 5.0
    """Longest pause between reads while the store is failing."""
    lag_threshold: float = 5.0
    """Seconds the reader may go without a finished read, or leave a change of the store
    undelivered, before clients are told ``delayed`` (``SENDQUEUE_STREAM_LAG_THRESHOLD``)."""
    status_interval: float = 1.0
    """Seconds between two comparisons of the reader's position with the store's newest change
    id, and between two checks that a read is not hanging."""
    signal_fallback: float = 2.0
    """With a change signal: seconds between two reads while nothing is signalled (a safety
    net; the signal brings changes at once). At most half ``lag_threshold``."""
    min_read_gap: float = 0.03
    """With a change signal: the least seconds from one read to the next. A lone change is read
    at once; a stream of them is read in batches this far apart, so each client gets one
    frame per batch instead of one per commit (what a client's event loop pays for most)."""


#: The heartbeat: an event (no ``id``) rather than a comment line, because EventSource hands
#: comments to no JavaScript, and the page must see the stream alive to trust it.
PING = "event: ping\ndata: {}\n\n"


class TooManyClients(Exception):
    """The process already serves ``max_clients`` streams (or is shutting down)."""


def format_event(entry: ChangeLogEntry) -> str:
    """One change as an SSE frame: ``id``, ``event: change`` and the JSON on one line."""
    data = json.dumps(change_dict(entry), ensure_ascii=False, separators=(",", ":"))
    return f"id: {entry.id}\nevent: change\ndata: {data}\n\n"


@functools.lru_cache(maxsize=4096)
def _shared_frame(entry: ChangeLogEntry) -> str:
    """:func:`format_event`, once per entry for all of its campaign's clients, not once each."""
    return format_event(entry)


@dataclass(eq=False)
class Subscription:
    """One connected client of one campaign."""

    campaign_id: str
    last_id: int
    """The id of the last entry sent (or the position the client starts after)."""
    queue: asyncio.Queue[ChangeLogEntry | StreamStatus | None]
    backlog_after: int | None = None
    """Set when the client resumes from further back than the reader: read this first."""
    closed: bool = False
    reason: str = ""
    released: bool = False
    status: tuple[str, str] | None = None
    """The key of the last status sent (see StreamStatus.key)."""


class _Wake:
    """The reader's side of the change signal: called on any thread, sets ``event`` on the
    loop (one callback in flight at most, however many commits are signalled meanwhile)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()
        self.pending = False

    def __call__(self) -> None:
        if self.pending:
            return  # the callback in flight sets the event after this commit anyway
        self.pending = True
        with contextlib.suppress(RuntimeError):  # the loop has closed
            self.loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        self.pending = False
        self.event.set()


@dataclass(eq=False)
class _Reader:
    position: int
    """The id of the last change-log entry read (of any campaign)."""
    health: ReaderHealth
    watched: dict[str, set[Subscription]] = field(default_factory=dict)
    """Campaign id -> its subscribers; only campaigns with one are here."""
    task: asyncio.Task[None] | None = None
    watch: asyncio.Task[None] | None = None
    """Judges the reader's health while a read may hang (see ChangeBroker._watch)."""
    status: StreamStatus = LIVE
    """What the clients were last told."""
    wake: _Wake | None = None
    """Set by the store's change signal (None: the reader polls)."""
    unsignal: Callable[[], None] | None = None
    retry: float = 0.0
    """While the store holds committed entries back: the pause before the next read."""
    last_read: float = -float("inf")
    """When the last read began (loop time)."""

    def stop(self) -> None:
        for task in (self.task, self.watch):
            if task is not None:
                task.cancel()
        self.release()

    def release(self) -> None:
        """Leave the change signal (idempotent)."""
        unsignal, self.unsignal = self.unsignal, None
        if unsignal is not None:
            unsignal()

    def drop(self, sub: Subscription) -> None:
        subs = self.watched.get(sub.campaign_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.watched[sub.campaign_id]


class ChangeBroker:
    """Fans the change log out to the connected clients by campaign; see the module docstring.

    All methods run on the event loop thread; store calls go to worker threads.
    """

    def __init__(
        self,
        store: ChangeLog,
        config: StreamConfig | None = None,
        signal: ChangeSignal | None = None,
    ) -> None:
        self._store = store
        self.config = config or StreamConfig()
        self._signal = signal
        self._reader: _Reader | None = None
        self._clients = 0
        self._closing = False

    # -- introspection (for /metrics and tests) ----------------------------------------------
    @property
    def clients(self) -> int:
        """Streams open now."""
        return self._clients

    def readers(self) -> dict[str, int]:
        """Campaigns the reader fans out to -> number of subscribers."""
        if self._reader is None:
            return {}
        return {cid: len(subs) for cid, subs in self._reader.watched.items()}

    def status(self) -> StreamStatus:
        """What the clients were last told of the reader (``live`` without a reader)."""
        return LIVE if self._reader is None else self._reader.status

    # -- subscribing ---------------------------------------------------------------------------
    async def subscribe(self, campaign_id: str, after: int | None) -> Subscription:
        """Join the campaign's fan-out, starting after change id ``after``.

        Without ``after`` the stream starts at the newest change. Raises TooManyClients.
        """
        if self._closing:
            raise TooManyClients("the server is shutting down")
        if self._clients >= self.config.max_clients:
            raise TooManyClients(f"already serving {self._clients} streams")
        self._clients += 1  # held across the await below, so the cap cannot be overrun
        try:
            head = await anyio.to_thread.run_sync(self._store.last_change_id)
        except BaseException:
            self._clients -= 1
            raise
        start = head if after is None else after
        sub = Subscription(campaign_id, start, asyncio.Queue(maxsize=self.config.queue_size))
        # No await from here on: joining is atomic with respect to the reader's fan-out, so
        # the reader delivers every entry above its current position to this subscriber.
        reader = self._reader
        if reader is None:
            # A new reader starts at the log's head, never further back: an old resume point
            # is this client's backlog, not a re-read of every campaign's history.
            loop = asyncio.get_running_loop()
            health = ReaderHealth(self.config.lag_threshold, loop.time())
            reader = self._reader = _Reader(head, health)
            if self._signal is not None:
                reader.wake = _Wake(loop)
                reader.unsignal = self._signal.subscribe(reader.wake)
            reader.task = loop.create_task(self._run(reader), name="sendqueue-stream-reader")
            reader.watch = loop.create_task(self._watch(reader), name="sendqueue-stream-watch")
        reader.watched.setdefault(campaign_id, set()).add(sub)
        if start < reader.position:
            sub.backlog_after = start
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Leave the fan-out (idempotent); the reader stops with the last subscriber."""
        if sub.released:
            return
        sub.released = True
        sub.closed = True
        self._clients -= 1
        reader = self._reader
        if reader is not None:
            reader.drop(sub)
            if not reader.watched:
                self._reader = None
                reader.stop()

    async def close(self) -> None:
        """End every stream and stop the reader (server shutdown). Idempotent."""
        self._closing = True
        reader, self._reader = self._reader, None
        if reader is None:
            return
        for subs in reader.watched.values():
            for sub in subs:
                self._close(sub, "shutdown")
        reader.watched.clear()
        reader.stop()
        for task in (reader.task, reader.watch):
            if task is not None:
                with anyio.CancelScope(shield=True):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    def _close(self, sub: Subscription, reason: str) -> None:
        sub.closed, sub.reason = True, reason
        # None wakes the client's generator; a full queue wakes it anyway.
        with contextlib.suppress(asyncio.QueueFull):
            sub.queue.put_nowait(None)

    # -- the reader ----------------------------------------------------------------------------
    async def _run(self, reader: _Reader) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        failures = 0
        last_change = loop.time()
        last_head_check = -float("inf")
        while reader.watched:
            if reader.wake is not None:
                reader.wake.event.clear()  # a commit signalled from now on is read next time
            reader.last_read = loop.time()
            try:
                entries, behind = await anyio.to_thread.run_sync(self._read_all, reader.position)
            except Exception as exc:  # the store failing must not end the streams
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    log.warning(
                        "stream: reading the change log failed (%d in a row): %s", failures, exc
                    )
                reader.health.read_failed()
                self._publish(reader)
                await asyncio.sleep(min(config.poll_interval * 2**failures, config.error_backoff))
                continue
            failures = 0
            if entries:
                last_change = loop.time()
                reader.position = entries[-1].id
                self._fan_out(reader, entries)
            reader.health.read_ok(loop.time(), reader.position)
            if loop.time() - last_head_check >= config.status_interval:
                # Is the store ahead of what the reader has read (entries held back behind a
                # transaction in flight count)? One cheap query a second.
                last_head_check = loop.time()
                try:
                    head = await anyio.to_thread.run_sync(self._store.newest_change_id)
                except Exception as exc:  # the next read says whether the store is failing
                    log.debug("stream: reading the newest change id failed: %s", exc)
                else:
                    reader.health.head_seen(loop.time(), head, reader.position)
            self._publish(reader)
            if len(entries) < config.batch:
                await self._pause(reader, loop.time() - last_change >= config.idle_after, behind)
        reader.release()

    async def _pause(self, reader: _Reader, quiet: bool, behind: bool) -> None:
        """Wait for the next read: a signalled commit (or ``signal_fallback``, or a short and
        growing retry while the store holds entries back), else the poll interval."""
        config = self.config
        if reader.wake is None:
            idle = max(config.idle_poll_interval, config.poll_interval)
            await asyncio.sleep(idle if quiet else config.poll_interval)
            return
        reader.retry = min(max(reader.retry * 2, 0.005), config.poll_interval) if behind else 0.0
        # Reads keep coming well within the lag threshold, or a quiet log would look stalled.
        fallback = min(config.signal_fallback, config.lag_threshold / 2)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader.wake.event.wait(), reader.retry or fallback)
        gap = reader.last_read + config.min_read_gap - asyncio.get_running_loop().time()
        if gap > 0:
            await asyncio.sleep(gap)

    async def _watch(self, reader: _Reader) -> None:
        """Judge the reader's health every ``status_interval`` even while a read hangs (the
        reader itself only judges it between reads)."""
        while reader.watched:
            await asyncio.sleep(self.config.status_interval)
            self._publish(reader)

    def _publish(self, reader: _Reader) -> None:
        """Tell every client when the reader's status changes (live <-> delayed, or why)."""
        status = reader.health.status(asyncio.get_running_loop().time())
        if status.key == reader.status.key:
            return
        if status.state == "delayed":
            log.warning("stream: clients told the live stream is delayed: %s", status.reason)
        else:
            log.info("stream: the live stream is live again")
        reader.status = status
        for subs in list(reader.watched.values()):
            for sub in list(subs):
                self._offer(reader, sub, [status])

    def _read_all(self, position: int) -> tuple[list[ChangeLogEntry], bool]:
        """The next batch, and whether the store holds newer committed entries back."""
        entries = self._store.changes_after(position, limit=self.config.batch)
        if (
            self._signal is None
            or not self._signal.settles_late
            or len(entries) == self.config.batch
        ):
            return entries, False
        return entries, self._store.newest_change_id() > (entries[-1].id if entries else position)

    def _read(self, campaign_id: str, position: int) -> list[ChangeLogEntry]:
        return self._store.changes_after(position, campaign_id=campaign_id, limit=self.config.batch)

    def _fan_out(self, reader: _Reader, entries: list[ChangeLogEntry]) -> None:
        by_campaign: dict[str, list[ChangeLogEntry]] = {}
        for entry in entries:
            if entry.campaign_id in reader.watched:
                by_campaign.setdefault(entry.campaign_id, []).append(entry)
        for campaign_id, mine in by_campaign.items():
            for sub in list(reader.watched.get(campaign_id, ())):
                self._offer(reader, sub, mine)

    def _offer(
        self,
        reader: _Reader,
        sub: Subscription,
        entries: list[ChangeLogEntry] | list[StreamStatus],
    ) -> None:
        for entry in entries:
            try:
                sub.queue.put_nowait(entry)
            except asyncio.QueueFull:
                # The client does not keep up: drop it rather than grow without bound. It
                # reconnects with Last-Event-ID and reads what it missed from the store.
                log.warning(
                    "stream of %s: a client fell %d events behind; disconnecting it",
                    sub.campaign_id,
                    sub.queue.qsize(),
                )
                reader.drop(sub)
                sub.closed, sub.reason = True, "overflow"
                if not reader.watched and self._reader is reader:
                    self._reader = None  # the loop ends: nobody is left to read for
                return

    # -- one client's frames -------------------------------------------------------------------
    async def frames(self, sub: Subscription) -> AsyncIterator[str]:
        """The SSE text for one subscriber, until it is closed. Unsubscribes at the end."""
        config = self.config
        try:
            status = self.status()
            sub.status = status.key
            yield f"retry: {config.retry_ms}\nid: {sub.last_id}\n\n{status.frame()}"
            if sub.backlog_after is not None:
                position = sub.backlog_after
                while not sub.closed:
                    try:
                        entries = await anyio.to_thread.run_sync(
                            self._read, sub.campaign_id, position
                        )
                    except Exception as exc:
                        # End the stream; the client reconnects with its Last-Event-ID.
                        log.warning("stream of %s: backlog read failed: %s", sub.campaign_id, exc)
                        return
                    text = self._render(sub, entries)
                    if text:
                        yield text
                    if len(entries) < config.batch:
                        break
                    position = entries[-1].id
            while not sub.closed:
                try:
                    first = await asyncio.wait_for(sub.queue.get(), config.heartbeat)
                except TimeoutError:
                    yield PING
                    continue
                if first is None or sub.closed:
                    return
                batch: list[ChangeLogEntry | StreamStatus] = [first]
                while len(batch) < config.batch and not sub.queue.empty():
                    entry = sub.queue.get_nowait()
                    if entry is None:
                        break
                    batch.append(entry)
                text = self._render(sub, batch)
                if text:
                    yield text
        finally:
            self.unsubscribe(sub)

    @staticmethod
    def _render(
        sub: Subscription, entries: list[ChangeLogEntry] | list[ChangeLogEntry | StreamStatus]
    ) -> str:
        parts: list[str] = []
        for entry in entries:
            if isinstance(entry, StreamStatus):
                if entry.key != sub.status:
                    parts.append(entry.frame())
                    sub.status = entry.key
            elif entry.id > sub.last_id:
                parts.append(_shared_frame(entry))
                sub.last_id = entry.id
        return "".join(parts)


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that ends as soon as the client goes away.

    Starlette's StreamingResponse notices a disconnect only on some ASGI versions; an idle
    stream would otherwise keep its subscription until the next heartbeat fails to send.
    """

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[str], headers: dict[str, str] | None = None):
        super().__init__(
            frames,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
            media_type="text/event-stream",
        )
        self.frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def pump(group: anyio.abc.TaskGroup) -> None:
            try:
                async for text in self.frames:
                    body = text.encode("utf-8")
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass  # the client went away mid-write
            finally:
                group.cancel_scope.cancel()

        async def listen(group: anyio.abc.TaskGroup) -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    group.cancel_scope.cancel()
                    return

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(pump, group)
                group.start_soon(listen, group)
        finally:
            close = getattr(self.frames, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()
