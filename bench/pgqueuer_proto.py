"""A pgqueuer prototype of the send path (the measured alternative to procrastinate), and the
queues alone with a no-op job.

Not a layer: a measurement. :class:`PgqueuerWorker` is one worker process's loop as a
pgqueuer deployment would run it: pgqueuer's ``QueueManager`` on one asyncpg connection
(dequeue in batches under ``FOR UPDATE SKIP LOCKED``, LISTEN/NOTIFY, completions written in
batches by its log buffer), each job's payload (a task id and token, JSON) handed to the same
target every layer calls (``Container.invoke``: the store's claim, MIME, the SMTP mailer, the
store's finish) on ``concurrency`` threads. It claims ``concurrency`` jobs a batch and holds at
most ``2 x concurrency``, as the procrastinate fire loop did when it was measured (it now
holds ``concurrency`` running plus what its threads start within 0.1 s, up to
``2 x concurrency``). asyncpg, not psycopg: pgqueuer's
psycopg driver runs its LISTEN watcher on the same connection under the connection's lock
(``notifies(timeout=1.0)``), so its statements wait up to 1 s each (docs/performance-history.md).

``python -m bench.pgqueuer_proto noop JOBS CONCURRENCY --store URL --queue QUEUE`` measures a
queue alone: JOBS due jobs enqueued in bulk beforehand, a no-op job, jobs/s from the worker's
start to the last job's call. ``fire-loop`` is the procrastinate layer's fire loop
(``adapters/procrastinate/firing.py``, its per-job handling included) with a no-op target;
``pgqueuer`` runs the no-op through the same thread hand-off as the send path,
``pgqueuer-async`` as an ``async`` entrypoint on pgqueuer's event loop (its own best case),
``pgqueuer-psycopg`` as ``pgqueuer`` on the psycopg driver. :func:`run_noop` runs them side by
side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import cpu_seconds, run_child, summarize
from sendqueue.domain.lifecycle import TaskState

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = [
    "ENTRYPOINT",
    "QUEUES",
    "PgqueuerWorker",
    "enqueue",
    "enqueue_campaign",
    "install",
    "run_noop",
]

#: The pgqueuer entrypoint of a send (its payload: ``{"task_id": ..., "token": ...}``).
ENTRYPOINT = "sendqueue.send"
#: What the no-op benchmark compares: the procrastinate layer's fire loop, and pgqueuer with the
#: job on a thread (as a send runs), as an async job on its loop, and on its psycopg driver.
QUEUES = ("fire-loop", "pgqueuer", "pgqueuer-async", "pgqueuer-psycopg")
_CHUNK = 5000


def conninfo(url: str) -> str:
    """A libpq URL from the SQLAlchemy one the benchmarks pass around."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


async def _connect(url: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True)


@contextlib.asynccontextmanager
async def _queries(url: str, driver: str) -> AsyncIterator[Any]:
    """pgqueuer's ``Queries`` on one connection of ``driver`` (psycopg or asyncpg)."""
    from pgqueuer import Queries

    if driver == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(conninfo(url))
        try:
            yield Queries.from_asyncpg_connection(conn)
        finally:
            await conn.close()
        return
    async with await _connect(url) as aconn:
        yield Queries.from_psycopg_connection(aconn)


def install(url: str) -> None:
    """pgqueuer's tables, types, triggers and functions, into the database at ``url`` (once:
    the throughput bench's repeats share a database)."""
    from pgqueuer import Queries

    async def go() -> None:
        async with await _connect(url) as conn:
            queries = Queries.from_psycopg_connection(conn)
            if not await queries.schema_is_installed():
                await queries.install()

    asyncio.run(go())


def enqueue(url: str, payloads: list[bytes], entrypoint: str = ENTRYPOINT) -> float:
    """Every payload as a job due now, in bulk (one statement per 5,000); the seconds taken."""
    from pgqueuer import Queries

    async def go() -> None:
        async with await _connect(url) as conn:
            queries = Queries.from_psycopg_connection(conn)
            for start in range(0, len(payloads), _CHUNK):
                chunk: list[bytes | None] = list(payloads[start : start + _CHUNK])
                await queries.enqueue([entrypoint] * len(chunk), chunk, [0] * len(chunk))

    started = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - started


def enqueue_campaign(app: Container, url: str, cid: str) -> int:
    """pgqueuer's schema into ``url``, then a send job due now for every Pending task of
    ``cid`` (payload: its id and token, as the other layers' schedules carry), in bulk; how
    many jobs."""
    from bench.sendpath import tasks_of

    install(url)
    payloads = [
        json.dumps({"task_id": task.id, "token": task.token}).encode()
        for task in tasks_of(app, cid)
        if task.state is TaskState.PENDING
    ]
    enqueue(url, payloads)
    return len(payloads)


class PgqueuerWorker:
    """One process's pgqueuer worker (module docstring); :meth:`run` is the Dispatcher port's
    shape (``run(target, stop)``), so it stands where the other layers' dispatcher runs.

    ``threaded=False`` runs the target as an ``async`` entrypoint on the event loop (for a
    no-op only: a real send blocks).
    """

    def __init__(
        self,
        url: str,
        *,
        concurrency: int,
        entrypoint: str = ENTRYPOINT,
        threaded: bool = True,
        poll_interval: float = 0.5,
        driver: str = "asyncpg",
    ) -> None:
        self.url = url
        self.concurrency = concurrency
        self.entrypoint = entrypoint
        self.threaded = threaded
        self.poll_interval = poll_interval
        self.driver = driver

    def run(self, target: Callable[[Mapping[str, str]], None], stop: threading.Event) -> None:
        asyncio.run(self._serve(target, stop))

    async def _serve(
        self, target: Callable[[Mapping[str, str]], None], stop: threading.Event
    ) -> None:
        from pgqueuer import Job, QueueManager

        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pgq-send")

        def handle(payload: bytes | None) -> None:
            target({"kind": "send", **json.loads(payload or b"{}")})

        async with _queries(self.url, self.driver) as queries:
            qm = QueueManager(queries)

            if self.threaded:

                @qm.entrypoint(self.entrypoint)
                async def send(job: Job) -> None:
                    await loop.run_in_executor(pool, handle, job.payload)

            else:

                @qm.entrypoint(self.entrypoint)
                async def send_inline(job: Job) -> None:
                    handle(job.payload)

            async def stop_on_event() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                qm.shutdown.set()

            watcher = asyncio.create_task(stop_on_event())
            try:
                await qm.run(
                    batch_size=self.concurrency,
                    max_concurrent_tasks=2 * self.concurrency,
                    dequeue_timeout=timedelta(seconds=self.poll_interval),
                )
            finally:
                watcher.cancel()
                pool.shutdown(wait=True)


# -- the queues alone: a no-op job ------------------------------------------------------------


class _Counter:
    """Counts a no-op target's calls; ``done`` is set, with its time, at the ``n``-th."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0
        self.last = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, payload: Mapping[str, Any]) -> None:
        with self._lock:
            self.calls += 1
            if self.calls == self.n:
                self.last = time.perf_counter()
                self.done.set()


def _noop_pgqueuer(url: str, jobs: int, concurrency: int, queue: str) -> dict[str, Any]:
    install(url)
    enqueue(url, [b"{}"] * jobs, entrypoint="bench.noop")
    counter = _Counter(jobs)
    stop = threading.Event()
    worker = PgqueuerWorker(
        url,
        concurrency=concurrency,
        entrypoint="bench.noop",
        threaded=queue != "pgqueuer-async",
        driver="psycopg" if queue == "pgqueuer-psycopg" else "asyncpg",
    )
    return _timed(counter, stop, lambda: worker.run(counter, stop))


def _noop_fire_loop(url: str, jobs: int, concurrency: int, home: Path) -> dict[str, Any]:
    """The procrastinate layer's fire loop on ``jobs`` due schedules (made as provisioning
    makes them, :func:`bench.sendpath.add_campaign`), its target a no-op."""
    from bench.sendpath import add_campaign
    from bench.throughput import _settings
    from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
    from sendqueue.bootstrap import bootstrap

    app = bootstrap(_settings(url, home, 1, concurrency, "procrastinate"))
    add_campaign(app, "noop", [time.time() - 1.0] * jobs)
    counter = _Counter(jobs)
    stop = threading.Event()
    scheduler = app.scheduler
    assert isinstance(scheduler, ProcrastinateScheduler)
    loop = scheduler._worker.fire_loop(counter)
    try:
        return _timed(counter, stop, lambda: loop.run(stop))
    finally:
        app.close()


def _timed(counter: _Counter, stop: threading.Event, run: Callable[[], None]) -> dict[str, Any]:
    """Run a queue's consumer on a thread until ``counter`` has seen every no-op job: its
    time to the last call and this process's CPU meanwhile."""
    thread = threading.Thread(target=run, daemon=True)
    cpu = cpu_seconds()
    started = time.perf_counter()
    thread.start()
    finished = counter.done.wait(600)
    cpu = cpu_seconds() - cpu
    stop.set()
    thread.join(60)
    if not finished:
        raise AssertionError(f"only {counter.calls} of {counter.n} no-op jobs ran")
    seconds = counter.last - started
    return {"seconds": seconds, "per_second": counter.n / seconds, "cpu_s": cpu}


def run_noop(
    *, jobs: int, concurrency: int, repeats: int, database: Callable[[], Any]
) -> dict[str, Any]:
    """Each queue of :data:`QUEUES` on a fresh database from ``database()`` (a context
    manager yielding a URL), alternating; jobs/s and client CPU per job."""
    runs: dict[str, list[dict[str, Any]]] = {q: [] for q in QUEUES}
    for n in range(repeats):
        for queue in QUEUES if n % 2 == 0 else tuple(reversed(QUEUES)):
            with database() as url:
                runs[queue].append(
                    run_child(
                        "bench.pgqueuer_proto",
                        "noop",
                        str(jobs),
                        str(concurrency),
                        "--store",
                        url,
                        "--queue",
                        queue,
                    )
                )
    out: dict[str, Any] = {"jobs": jobs, "concurrency": concurrency, "repeats": repeats}
    out["queues"] = {
        q: {
            "per_second": summarize([r["per_second"] for r in runs[q]]).as_dict(),
            "cpu_ms_per_job": summarize([1000 * r["cpu_s"] / jobs for r in runs[q]]).as_dict(),
        }
        for q in QUEUES
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pgqueuer_proto")
    parser.add_argument("side", choices=["noop"])
    parser.add_argument("jobs", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--store", required=True, help="an empty PostgreSQL database")
    parser.add_argument("--queue", choices=QUEUES, required=True)
    args = parser.parse_args()
    if args.queue == "fire-loop":
        with tempfile.TemporaryDirectory(prefix="sq-bench-noop-") as tmp:
            result = _noop_fire_loop(args.store, args.jobs, args.concurrency, Path(tmp))
    else:
        result = _noop_pgqueuer(args.store, args.jobs, args.concurrency, args.queue)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
