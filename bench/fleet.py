"""Benchmark 9: the procrastinate execution layer as a fleet of worker processes.

Each row starts N real ``sendqueue worker`` processes (:class:`bench.fleetproc.Fleet`, the
command's entry point with SENDQUEUE_* settings), waits until every one has logged its start,
and measures them from outside, through the task store: nothing here knows how the worker
fetches its jobs. Then the bench's own container writes the tasks and their schedules (through
the schedule writer, as provisioning does) due from an instant ``T`` just after that set-up
will be done, and watches until every task is Finished. A row whose set-up overran ``T`` is
sent anyway and measured again with a longer lead.

Rows, each with 1, 2 and 4 worker processes (``workers``):

- throughput: ``emails`` tasks all due at ``T`` (a due backlog); emails per second from ``T``
  to the last ``sent_at``, as a ratio to the raw smtplib loop and to one process;
- dispatch: ``rate`` due per second for ``spread`` seconds, then a ``burst`` due at one
  instant 2 s later (:func:`bench.dispatch.due_times`); lateness of each task's claim (the
  fire: ``claimed_at`` minus its due time) and of its send (``sent_at``), p50/p99/max, and the
  burst's drain (its last claim minus its due instant);
- both again with ``waiting`` more jobs in procrastinate's waiting set: tasks of another
  campaign due two hours later, whose schedules are created as procrastinate jobs (the bench's
  writer has a horizon past them), so the fetch of every row runs beside them.

Beside them in the same run: the embedded layer (SQLite store, one ``sendqueue worker``
process: the layer is one machine) in the same harness, and the raw smtplib loop of
:mod:`bench.throughput` (``concurrency`` threads) measured at the start and at the end.
Every row records its workers' CPU time, the database's backends' CPU time, the machine's busy
share of all cores (:class:`bench.fleetproc.Usage`) and, on PostgreSQL, the most connections
each worker held (``pg_stat_activity`` by application name).

The procrastinate rows share one fresh database (the caller's; :mod:`bench.__main__` creates
and drops it). The workers run with ``SENDQUEUE_SPACE_LATE_SENDS=false`` and a one-hour
``SENDQUEUE_MAX_LATENESS``, so a backlog is sent as fast as they can, not moved or spaced.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import POSTGRES_ADMIN_URL, run_child
from bench.dispatch import due_times, figures
from bench.fleetproc import Fleet, Usage
from bench.sendpath import add_campaign, task_times, wait_sent
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.ports import Scheduler
from sendqueue.settings import Settings

__all__ = ["DEFAULT_WORKERS", "run"]

DEFAULT_WORKERS = (1, 2, 4)
#: The fleet targets (benchmarks, not tests)
ONE_WORKER_VS_RAW = 0.6
TWO_WORKERS_VS_ONE = 1.6
P99_LIMIT_MS = 1000.0
DRAIN_LIMIT_S = 10.0
#: The waiting set is due this far ahead: long after the bench has finished.
WAITING_AHEAD_S = 2 * 3600.0


class _Layer:
    """An execution layer under test: the workers' settings and the bench's own container."""

    def __init__(self, name: str, env: dict[str, str], database: str | None) -> None:
        self.name = name
        self.env = env
        self.database = database
        self.app = _container(env)
        # schedules created per second, a first guess, then each row's set-up
        self.create_rate = 1000.0 if name == "embedded" else 150.0


def _env(*, store: str, execution: str, home: Path, port: int, concurrency: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENDQUEUE_", "PGAPPNAME"))}
    env.update(
        SENDQUEUE_DATABASE_URL=store,
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{home / 'scheduler.db'}",
        SENDQUEUE_EXECUTION=execution,
        SENDQUEUE_MAILER=f"smtp://127.0.0.1:{port}?security=none",
        SENDQUEUE_WORKER_CONCURRENCY=str(concurrency),
        SENDQUEUE_AUTO_PAUSE_AFTER="0",
        # a backlog is sent as fast as the workers can (what is measured), not moved or spaced
        SENDQUEUE_MAX_LATENESS="3600",
        SENDQUEUE_SPACE_LATE_SENDS="false",
        # the reconciler's periodic pass (once a day at midnight UTC) stays out of the rows
        SENDQUEUE_RECONCILE_INTERVAL="86400",
    )
    return env


def _container(env: dict[str, str], scheduler: Scheduler | None = None) -> Container:
    """The container the workers build from ``env``, for the bench's own writes and reads."""
    values: dict[str, Any] = {
        k.removeprefix("SENDQUEUE_").lower(): v
        for k, v in env.items()
        if k.startswith("SENDQUEUE_")
    }
    return bootstrap(Settings(_env_file=None, **values), scheduler=scheduler)


def _measure(
    layer: _Layer, workers: int, offsets: list[float], home: Path, tag: str, timeout: float
) -> dict[str, Any]:
    """One row: ``workers`` processes started, then tasks due at ``T + offsets``; the raw
    observations. ``T`` leaves the set-up (at the last row's create rate) time to finish."""
    factor = 1.0
    began = time.monotonic()
    for attempt in range(3):
        cid = f"{tag}-{attempt}"
        with Fleet(workers, layer.env, home, cid) as fleet:
            launched = time.monotonic()
            fleet.wait_ready(180.0)
            started_s = time.monotonic() - launched
            # generous: an overrun costs a whole row more (it is sent, then measured again)
            t0 = time.time() + (len(offsets) / layer.create_rate * 2.0 + 1.0) * factor
            due = [t0 + o for o in offsets]
            create_s = add_campaign(layer.app, cid, due)
            layer.create_rate = len(due) / create_s
            margin = t0 - time.time()
            time.sleep(max(0.0, margin))
            usage = Usage(fleet.pids, layer.database, POSTGRES_ADMIN_URL).start()
            deadline = time.monotonic() + max(0.0, due[-1] - time.time()) + timeout
            done = wait_sent(layer.app, cid, deadline, check=fleet.check)
            used = usage.stop()
        if not done:
            counts = {s.value: n for s, n in layer.app.store.count_tasks(cid).items() if n}
            raise RuntimeError(f"{tag}: not sent {timeout:g} s after the last due time: {counts}")
        if margin < 0.5:  # the set-up overran T: measure again with a longer lead
            factor *= 2
            continue
        took = time.monotonic() - began
        print(f"[fleet] {cid}: {workers} workers, {len(due):,} tasks: {took:.0f} s in all "
              f"(start {started_s:.1f} s, set-up {create_s:.1f} s, {margin:.1f} s to spare)",
              file=sys.stderr, flush=True)  # fmt: skip
        claimed, sent = task_times(layer.app, cid)
        if len(sent) != len(due):
            raise RuntimeError(f"{tag}: {len(due) - len(sent)} of {len(due)} tasks not Finished")
        return {
            "due": due,
            "claimed": claimed,
            "sent": sent,
            "creates_per_second": len(due) / create_s,
            "spare_s": margin,
            "usage": used,
        }
    raise RuntimeError(f"{tag}: the set-up kept overrunning the due instant")


def _throughput(layer: _Layer, workers: int, emails: int, home: Path, tag: str) -> dict[str, Any]:
    seen = _measure(layer, workers, [0.0] * emails, home, tag, timeout=max(120.0, emails / 10))
    seconds = max(seen["sent"].values()) - seen["due"][0]
    return {
        "kind": "throughput",
        "seconds": seconds,
        "per_second": emails / seconds,
        "creates_per_second": seen["creates_per_second"],
        "spare_s": seen["spare_s"],
        "usage": seen["usage"],
    }


def _dispatch(
    layer: _Layer, workers: int, sizes: tuple[int, float, int], home: Path, tag: str
) -> dict[str, Any]:
    schedules, spread, burst = sizes
    offsets = due_times(0.0, schedules, spread, burst)
    timeout = max(120.0, len(offsets) / 10)
    seen = _measure(layer, workers, offsets, home, tag, timeout)
    sent = figures(seen["due"], seen["sent"], schedules, burst)
    return {
        "kind": "dispatch",
        **figures(seen["due"], seen["claimed"], schedules, burst),
        **{f"sent_{k}": v for k, v in sent.items()},
        "creates_per_second": seen["creates_per_second"],
        "spare_s": seen["spare_s"],
        "usage": seen["usage"],
    }


def _waiting_set(layer: _Layer, count: int) -> dict[str, Any]:
    """``count`` Pending tasks of another campaign due two hours on, their schedules created as
    procrastinate jobs (a writer whose horizon reaches past them). Returns how many jobs
    procrastinate then holds waiting (todo, due later)."""
    import psycopg

    from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
    from sendqueue.adapters.procrastinate.schema import conninfo_from_url

    url = layer.env["SENDQUEUE_DATABASE_URL"]
    scheduler = ProcrastinateScheduler(
        url, horizon=WAITING_AHEAD_S + 3600, reconcile_interval=None, pool_size=12, upgrade=False
    )
    app = _container(layer.env, scheduler)
    try:
        later = time.time() + WAITING_AHEAD_S
        create_s = add_campaign(app, "waiting", [later + 60 * i / count for i in range(count)])
    finally:
        app.close()
    with psycopg.connect(conninfo_from_url(url), connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo' AND scheduled_at > now()"
        ).fetchone()
    return {"tasks": count, "jobs_waiting": row[0] if row else 0, "create_s": create_s}


def _raw(port: int, emails: int, concurrency: int) -> float:
    result = run_child("bench.throughput", "raw", str(port), str(emails), str(concurrency))
    return float(result["per_second"])


def run(
    *,
    emails: int,
    rate: float,
    spread: float,
    burst: int,
    waiting: int,
    concurrency: int,
    port: int,
    postgres_url: str | None,
    workers: Sequence[int] = DEFAULT_WORKERS,
) -> dict[str, Any]:
    """``postgres_url``: the empty database of the procrastinate rows (None: the embedded layer
    and the raw loop only). ``rate`` due per second over ``spread`` seconds, then ``burst``."""
    schedules = max(1, round(rate * spread))
    out: dict[str, Any] = {
        "emails": emails,
        "rate": rate,
        "spread_s": spread,
        "schedules": schedules,
        "burst": burst,
        "waiting": waiting,
        "workers": list(workers),
        "concurrency": concurrency,
        "rows": [],
        "targets": [],
    }
    rows: list[dict[str, Any]] = out["rows"]
    raw = [_raw(port, emails, concurrency)]
    sizes = (schedules, spread, burst)
    with tempfile.TemporaryDirectory(prefix="sq-bench-fleet-") as tmp:
        home = Path(tmp)
        (home / "embedded").mkdir()
        sqlite = f"sqlite:///{home / 'embedded' / 'store.db'}"
        plans: list[tuple[str, str, Path, tuple[int, ...], list[int]]] = [
            ("embedded", sqlite, home / "embedded", (1,), [0])
        ]
        if postgres_url is not None:
            held = [0, waiting] if waiting else [0]
            plans.append(("procrastinate", postgres_url, home, tuple(workers), held))
        for execution, store, where, counts, sets in plans:
            env = _env(store=store, execution=execution, home=where, port=port,
                       concurrency=concurrency)  # fmt: skip
            database = store.rsplit("/", 1)[1] if execution == "procrastinate" else None
            layer = _Layer(execution, env, database)
            try:
                for held_jobs in sets:
                    if held_jobs:
                        out["waiting_set"] = _waiting_set(layer, held_jobs)
                    for n in counts:
                        tag = f"{execution[:5]}-w{n}" + (f"-held{held_jobs}" if held_jobs else "")
                        common = {"layer": execution, "workers": n, "waiting": held_jobs}
                        rows.append({**common, **_throughput(layer, n, emails, home, f"tp-{tag}")})
                        rows.append({**common, **_dispatch(layer, n, sizes, home, f"di-{tag}")})
            finally:
                layer.app.close()
    raw.append(_raw(port, emails, concurrency))
    out["raw_per_second"] = raw
    _ratios(out)
    return out


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def _ratios(out: dict[str, Any]) -> None:
    """Each throughput row against the raw loop (the mean of its two runs) and against one
    process of its layer and waiting set; then the fleet targets."""
    raw = sum(out["raw_per_second"]) / len(out["raw_per_second"])
    rows = out["rows"]
    for row in rows:
        if row["kind"] != "throughput":
            continue
        row["vs_raw"] = row["per_second"] / raw
        one = _find(rows, kind="throughput", layer=row["layer"], waiting=row["waiting"], workers=1)
        if one is not None:
            row["vs_one_process"] = row["per_second"] / one["per_second"]
    targets = out["targets"]
    one = _find(rows, kind="throughput", layer="procrastinate", waiting=0, workers=1)
    if one is not None:
        targets.append(_target(f"procrastinate, 1 worker process: throughput >= "
                               f"{ONE_WORKER_VS_RAW}x the raw loop", one["vs_raw"],
                               ONE_WORKER_VS_RAW, "x"))  # fmt: skip
    two = _find(rows, kind="throughput", layer="procrastinate", waiting=0, workers=2)
    if two is not None and "vs_one_process" in two:
        busy = two["usage"]["machine_busy_percent"]
        targets.append(_target(f"procrastinate, 2 worker processes: throughput >= "
                               f"{TWO_WORKERS_VS_ONE}x one (machine {busy:.0f}% busy)",
                               two["vs_one_process"], TWO_WORKERS_VS_ONE, "x"))  # fmt: skip
    lat = _find(rows, kind="dispatch", layer="procrastinate", waiting=0, workers=2)
    if lat is not None:
        whole = lat["missing"] == 0
        targets.append(_target(f"procrastinate, 2 workers at {out['rate']:g} due/s: p99 "
                               f"lateness <= {P99_LIMIT_MS:g} ms", lat["p99_ms"], P99_LIMIT_MS,
                               "ms", whole))  # fmt: skip
    if lat is not None and out["burst"]:
        targets.append(_target(f"procrastinate, 2 workers: {out['burst']:,}-burst drained <= "
                               f"{DRAIN_LIMIT_S:g} s", lat["burst_drain_s"], DRAIN_LIMIT_S, "s",
                               lat["missing"] == 0))  # fmt: skip


def _target(name: str, value: float, limit: float, unit: str, whole: bool = True) -> dict[str, Any]:
    below = unit in {"ms", "s"}  # lateness and drain: at most; ratios: at least
    passed = whole and (value <= limit if below else value >= limit)
    return {"name": name, "value": value, "limit": limit, "unit": unit, "passed": passed}
