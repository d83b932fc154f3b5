"""Where a job's time goes on the procrastinate layer: client-side timers on the send path.

``python -m bench.profile_procrastinate PORT EMAILS CONCURRENCY --store URL`` runs the
procrastinate child of :mod:`bench.throughput` (one worker process, a due backlog sent into the
SMTP sink on PORT) with timers wrapped around the calls a job goes through: procrastinate's
``fetch_job`` / ``finish_job`` (when its worker runs the fire jobs), the fire loop's
``settle_and_claim`` and ``heartbeat`` (when it does), the store's ``transition`` (the task's
claim and finish) and reads (``get_task``, ``campaign_state``), the mailer's ``send`` and the
whole target. ``--execution pgqueuer`` runs the same child on the pgqueuer prototype
(:mod:`bench.pgqueuer_proto`, its asyncpg statements timed too), ``--execution embedded`` on
the embedded layer. Prints one JSON line: the run's figures and, per call, count, mean, p50,
p99 and total seconds. Works on any checkout of the layer (what is absent is not timed), so
the code before and after a change can be compared by putting its ``src`` first on
``PYTHONPATH``. The profile figures in docs/performance-history.md come
from this and from py-spy and pg_stat_statements.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]

_spans: defaultdict[str, list[float]] = defaultdict(list)
_lock = threading.Lock()


def _timed(owner: Any, name: str, kind: str) -> None:
    """Wrap ``owner.name`` (sync or async) so each call's wall time is recorded as ``kind``."""
    func: Callable[..., Any] | None = getattr(owner, name, None)
    if func is None:
        return
    original = func

    def record(started: float) -> None:
        with _lock:
            _spans[kind].append(time.perf_counter() - started)

    if hasattr(original, "__code__") and original.__code__.co_flags & 0x80:  # a coroutine

        @functools.wraps(original)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                record(started)

        setattr(owner, name, timed_async)
        return

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record(started)

    setattr(owner, name, timed)


def _instrument() -> None:
    from procrastinate.manager import JobManager

    from sendqueue.adapters.mail.smtp import SmtpMailer
    from sendqueue.adapters.procrastinate.jobs import Jobs
    from sendqueue.adapters.sql.base import SqlTaskStore
    from sendqueue.bootstrap import Container

    _timed(JobManager, "fetch_job", "procrastinate fetch_job")
    _timed(JobManager, "finish_job", "procrastinate finish_job")
    _timed(Jobs, "settle_and_claim", "fire loop settle_and_claim")
    _timed(Jobs, "heartbeat", "fire loop heartbeat")
    _timed(SqlTaskStore, "transition", "store transition (task claim / finish)")
    with contextlib.suppress(ImportError):  # the reads of a send, on the PostgreSQL store
        from sendqueue.adapters.sql.postgres import PostgresTaskStore

        _timed(PostgresTaskStore, "get_task", "store get_task (the read before the claim)")
        _timed(PostgresTaskStore, "campaign_state", "store campaign_state (after the claim)")
    _timed(SmtpMailer, "send", "mailer send (MIME + SMTP)")
    _timed(Container, "invoke", "target (the whole send)")
    with contextlib.suppress(ImportError):  # the pgqueuer prototype's statements
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver

        _timed(AsyncpgDriver, "fetch", "pgqueuer fetch (dequeue, probes)")
        _timed(AsyncpgDriver, "execute", "pgqueuer execute (completions, heartbeats)")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_procrastinate")
    parser.add_argument("port", type=int)
    parser.add_argument("emails", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--store", required=True, help="an empty PostgreSQL database")
    parser.add_argument(
        "--execution",
        choices=["procrastinate", "pgqueuer", "embedded"],
        default="procrastinate",
        help="pgqueuer: the prototype of bench.pgqueuer_proto; embedded: the embedded layer",
    )
    args = parser.parse_args()
    _instrument()
    from bench.throughput import child_sendqueue

    with tempfile.TemporaryDirectory(prefix="sq-bench-profile-") as tmp:
        result = child_sendqueue(
            args.store, Path(tmp), args.port, args.emails, args.concurrency, args.execution
        )
    calls: dict[str, dict[str, float]] = {}
    for kind, spans in _spans.items():
        ordered = sorted(spans)
        calls[kind] = {
            "n": len(ordered),
            "mean_ms": 1000 * sum(ordered) / len(ordered),
            "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "total_s": sum(ordered),
        }
    print(json.dumps({"result": result, "calls": calls}))


if __name__ == "__main__":
    main()
