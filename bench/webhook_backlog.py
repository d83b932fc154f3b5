"""Benchmark 15's backlog: ``seconds`` of events at ``rate`` a second, then drained.

The backlog is what ``seconds`` of changes at ``rate`` leave in the change log (600,000 for the
target's 10 minutes at 1,000 a second): campaigns of ``rate`` Pending tasks each, every one
cancelled by ``TaskStore.transition_all`` (the statement a campaign's cancel runs: one
``email.cancelled`` row per task, as a user's cancel writes it), the ``i``-th campaign's at the
``i``-th second of a timeline that ends now. The rows are made faster than real time, so "the
rate at which it was made" is ``rate`` by construction, and their timestamps say so.

The endpoint is added after the tasks and before the cancels: its backlog is exactly those
events. A worker process with nothing to send (``python -m bench.webhook_setup deliver``, the
real ``run_worker``) drains it from ``go``; the drain lasts until the receiver's last arrival.
Every event must arrive, in order, validly signed, each in its own request, and the delivery
log must hold one attempt per request.
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.fleetproc import machine_ticks
from bench.webhook_receiver import receiver
from bench.webhook_setup import (
    Child,
    child_env,
    delivery_log_rows,
    open_app,
    pending_tasks,
    report,
    wait_cursor,
)

__all__ = ["TARGET", "run"]

#: The backlog must drain at least this many times as fast as it was made.
TARGET = 5.0
_KEPT = ("by_type", "delivered", "lost", "repeated", "badly_signed", "in_order", "requests")


def _make(app: Any, rate: int, seconds: int) -> dict[str, Any]:
    """The backlog's tasks, the endpoint, then the backlog itself; what it took."""
    from sendqueue.domain.lifecycle import TaskState

    t0 = time.perf_counter()
    campaigns = [f"cbacklog{i:05d}" for i in range(seconds)]
    for name in campaigns:
        pending_tasks(app, rate, name)
    tasks_s = time.perf_counter() - t0
    created = app.webhooks.add("http://127.0.0.1:9/hook")  # the receiver's port comes later
    first = app.store.last_change_id()
    start = datetime.now(UTC) - timedelta(seconds=seconds)
    t0 = time.perf_counter()
    for i, name in enumerate(campaigns):
        at = start + timedelta(seconds=i)
        app.store.transition_all(
            name, TaskState.PENDING, TaskState.CANCELLED, at=at, note="campaign cancelled"
        )
    return {
        "endpoint": created.endpoint.id,
        "secret": created.secret,
        "first": first,
        "end": app.store.last_change_id(),
        "tasks_s": tasks_s,
        "events_s": time.perf_counter() - t0,
    }


def run(*, rate: int, seconds: int, poll: float, timeout: float = 3600) -> dict[str, Any]:
    """Make the backlog, drain it through a worker process, check and time what arrived."""
    with tempfile.TemporaryDirectory(prefix="bench-webhooks-backlog-") as tmp:
        home = Path(tmp)
        store = home / "store.db"
        app = open_app(store, home)
        try:
            made = _make(app, rate, seconds)
            endpoint = made["endpoint"]
            child = Child(["bench.webhook_setup", "deliver", f"sqlite:///{store}"],
                          child_env(poll))  # fmt: skip
            try:
                child.expect("ready", 120)
                with receiver(home, made["secret"]) as (port, log, receiver_cpu):
                    app.webhooks.update(endpoint, url=f"http://127.0.0.1:{port}/hook")
                    busy0, total0 = machine_ticks()
                    cpu0 = receiver_cpu() or 0.0
                    go = time.time()
                    child.say("go")
                    drained = wait_cursor(app, endpoint, made["end"], timeout)
                    busy1, total1 = machine_ticks()
                    cpu1 = receiver_cpu() or 0.0
                    worker = child.stop()
            finally:
                child.kill()
            seen = report(app, made["first"], made["end"], log)
        finally:
            app.close()
        logged = delivery_log_rows(store, endpoint)
    events = seen["events"]
    drain_s = seen["last_arrival"] - go
    per_second = events / drain_s if drained and drain_s > 0 else 0.0
    ratio = per_second / rate
    complete = drained and seen["lost"] == 0 and seen["badly_signed"] == 0 and seen["in_order"]
    return {
        "rate": rate,
        "seconds": seconds,
        "events": events,
        "tasks_written_s": made["tasks_s"],
        "events_written_s": made["events_s"],
        "drain_s": drain_s,
        "drain_per_s": per_second,
        "ratio": ratio,
        "worker_cpu_s": worker["cpu_s"],
        "receiver_cpu_s": cpu1 - cpu0,
        "machine_busy_percent": 100 * (busy1 - busy0) / max(total1 - total0, 1),
        # the lag says nothing here: the events are dated over the backlog's past seconds
        **{k: v for k, v in seen.items() if k in _KEPT},
        **logged,
        "target": {
            "name": f"a {seconds:,}-s backlog ({events:,} events made at {rate:,}/s) drained "
            f">= {TARGET:g}x as fast, every event once, in order, signed",
            "value": ratio,
            "limit": TARGET,
            "unit": "x",
            "passed": complete and ratio >= TARGET,
        },
    }
