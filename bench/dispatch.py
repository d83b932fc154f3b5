"""Benchmark 3 (and 7 on PostgreSQL): dispatch lateness.

The set: ``schedules`` one-time schedules due evenly over ``spread`` seconds, then a burst of
``burst`` schedules all due at one instant 2 s after the last of them. Lateness is the time a
target starts minus its due time. Reported: p50, p99 and max lateness of the evenly spread
ones, and the time from the burst's due instant until its last schedule fired (the drain).

Variants, each in its own child process, alternating over the repeats:

- ``sendqueue``: the embedded execution layer (its SQLite file, its dispatcher), schedules
  written with ``create_many`` (the provisioning path), a target that records the time;
- ``apscheduler-memory``: APScheduler 3, BackgroundScheduler, MemoryJobStore;
- ``apscheduler-sqlite``: APScheduler 3, SQLAlchemyJobStore on a SQLite file, given the same
  journal settings as sendqueue's (WAL, synchronous=NORMAL) so neither pays more fsyncs;
- ``procrastinate``: the procrastinate execution layer (``SENDQUEUE_EXECUTION=procrastinate``)
  on a fresh PostgreSQL database, with the task store's tables beside its own (as deployed):
  schedules written one ``create`` at a time on as many threads as the provisioning path
  uses, one worker process (this dispatcher, ``concurrency`` slots) firing the recording
  target. Its poll interval (0.5 s) and LISTEN/NOTIFY are the adapter's defaults;
- ``sendqueue-full``: the whole send path instead of a recording target: dispatcher -> worker
  claim in the task store (SQLite, or PostgreSQL with ``--postgres``) -> SMTP into the sink ->
  Finished. Its lateness is the claim (fire) and the Finished (after SMTP) minus the due time.

Every variant runs its targets on the same number of threads (``concurrency``); APScheduler's
jobs get ``misfire_grace_time=None`` so a late job still runs (its default would skip jobs
later than 1 s, hiding lateness). The schedules are created before the first is due; the time
that takes is reported as the create rate.

Anchors (documented, not measured here): EventBridge Scheduler fires one-time schedules within
60 s of their time; procrastinate polls for due jobs every 5 s by default.

Child entry point: ``python -m bench.dispatch VARIANT OPTIONS`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, percentile, postgres_database, run_child, summarize
from bench.workers import extra_workers, wait_for_line

__all__ = [
    "ANCHORS",
    "BURST_TARGET_S",
    "P99_TARGET_MS",
    "PROCRASTINATE_CREATE_THREADS",
    "VARIANTS",
    "due_times",
    "figures",
    "run",
]

P99_TARGET_MS = 250.0
BURST_TARGET_S = 5.0
VARIANTS = ("sendqueue", "apscheduler-memory", "apscheduler-sqlite")
#: Threads creating procrastinate schedules: the provisioning path's (``provision_concurrency``).
PROCRASTINATE_CREATE_THREADS = 10
ANCHORS = {
    "eventbridge_scheduler_precision_s": 60.0,
    "procrastinate_default_poll_s": 5.0,
}


# -- the set of due times ------------------------------------------------------------------------


def due_times(t0: float, schedules: int, spread: float, burst: int) -> list[float]:
    """Epoch seconds: ``schedules`` evenly over [t0, t0 + spread), then ``burst`` at once."""
    steady = [t0 + spread * i / schedules for i in range(schedules)]
    burst_at = t0 + spread + 2.0
    return steady + [burst_at] * burst


def figures(
    due: list[float], fired: dict[int, float], schedules: int, burst: int
) -> dict[str, Any]:
    """Lateness of ``fired`` (index -> epoch) against ``due`` (the set of :func:`due_times`)."""
    missing = len(due) - len(fired)
    steady = [(fired[i] - due[i]) * 1000 for i in range(schedules) if i in fired]
    burst_fired = [fired[i] for i in range(schedules, schedules + burst) if i in fired]
    burst_at = due[schedules] if burst else 0.0
    out: dict[str, Any] = {"missing": missing}
    if steady:
        out.update(
            p50_ms=percentile(steady, 0.5),
            p99_ms=percentile(steady, 0.99),
            max_ms=max(steady),
            min_ms=min(steady),
        )
    if burst_fired:
        out.update(
            burst_drain_s=max(burst_fired) - burst_at,
            burst_p50_ms=percentile([(t - burst_at) * 1000 for t in burst_fired], 0.5),
        )
    return out


# -- children ---------------------------------------------------------------------------------


class _Recorder:
    def __init__(self, total: int) -> None:
        self.fired: dict[int, float] = {}
        self.total = total
        self.done = threading.Event()
        self._lock = threading.Lock()

    def record(self, index: int) -> None:
        now = time.time()
        with self._lock:
            self.fired.setdefault(index, now)
            if len(self.fired) >= self.total:
                self.done.set()


_RECORDER: _Recorder | None = None


def _fire(index: int) -> None:
    """APScheduler's job: module-level, so its SQLAlchemy job store can pickle a reference."""
    assert _RECORDER is not None
    _RECORDER.record(index)


def _lead(create_rate: float, total: int) -> float:
    """Seconds from now to the first due time: creating everything must be done by then."""
    return total / create_rate * 1.5 + 2.0


def child_sendqueue(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler

    total = args.schedules + args.burst
    # Calibrate: how fast are schedules created here, now (a throwaway file)?
    with EmbeddedScheduler(f"sqlite:///{home / 'calibrate.db'}") as probe:
        far = datetime(2099, 1, 1, tzinfo=UTC)
        items = [(f"c-{i}", "bench", far, "UTC", {"i": str(i)}, f"t{i}", 2) for i in range(2000)]
        started = time.perf_counter()
        probe.create_many(items)
        rate = len(items) / (time.perf_counter() - started)
    scheduler = EmbeddedScheduler(
        f"sqlite:///{home / 'scheduler.db'}", concurrency=args.concurrency
    )
    t0 = time.time() + _lead(rate, total) * args.lead_factor
    due = due_times(t0, args.schedules, args.spread, args.burst)
    created = time.perf_counter()
    for start in range(0, total, 1000):
        batch = []
        for i in range(start, min(total, start + 1000)):
            at = datetime.fromtimestamp(due[i], UTC)
            batch.append((f"b-{i}", "bench", at, "UTC", {"i": str(i)}, f"t{i}", 2))
        scheduler.create_many(batch)
    create_s = time.perf_counter() - created
    recorder = _Recorder(total)
    stop = threading.Event()
    dispatcher = threading.Thread(
        target=scheduler.run, args=(lambda p: recorder.record(int(p["i"])), stop), daemon=True
    )
    if time.time() > t0 - 0.2:
        return {"overran": True, "create_s": create_s}
    cpu = cpu_seconds()
    dispatcher.start()
    recorder.done.wait(max(0.0, due[-1] - time.time()) + args.timeout)
    cpu = cpu_seconds() - cpu
    stop.set()
    dispatcher.join(30)
    scheduler.close()
    return {
        **figures(due, recorder.fired, args.schedules, args.burst),
        "create_s": create_s,
        "creates_per_second": total / create_s,
        "cpu_s": cpu,
    }


def child_procrastinate(args: argparse.Namespace, url: str, argv: list[str]) -> dict[str, Any]:
    """The procrastinate layer on the fresh PostgreSQL database ``url``; ``args.workers - 1``
    more worker processes (``procrastinate-extra``, given ``argv``) fire beside this one."""
    with ExitStack() as stack:
        return _procrastinate(args, url, argv, stack, args.workers - 1)


def _fire_jobs_left(url: str) -> bool:
    import psycopg

    from sendqueue.adapters.procrastinate.schema import conninfo_from_url

    with psycopg.connect(conninfo_from_url(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'sendqueue.fire' "
            "AND status IN ('todo', 'doing')"
        ).fetchone()
    return bool(row and row[0])


def _procrastinate_horizon(lead: float, args: argparse.Namespace) -> float:
    # Every schedule must be a job when the run starts: none may wait parked for the promoter,
    # whose cron tick would add up to a minute to the lateness measured here.
    return max(300.0, lead + float(args.spread) + 60.0)


def child_procrastinate_extra(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Another worker process of the procrastinate variant: fires from ``go`` to ``stop``
    (:mod:`bench.workers`) and returns when each schedule it fired did."""
    from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler

    scheduler = ProcrastinateScheduler(
        url, concurrency=args.concurrency, reconcile_interval=None, upgrade=False
    )
    recorder = _Recorder(args.schedules + args.burst)
    stop = threading.Event()
    dispatcher = threading.Thread(
        target=scheduler.run, args=(lambda p: recorder.record(int(p["i"])), stop), daemon=True
    )
    print("ready", flush=True)
    wait_for_line(sys.stdin, "go")
    dispatcher.start()
    wait_for_line(sys.stdin, "stop")
    stop.set()
    dispatcher.join(60)
    scheduler.close()
    return {"fired": recorder.fired}


def _procrastinate(
    args: argparse.Namespace, url: str, argv: list[str], stack: ExitStack, n_extra: int
) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

    from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
    from sendqueue.adapters.procrastinate.schema import conninfo_from_url
    from sendqueue.adapters.sql import open_store

    total = args.schedules + args.burst
    open_store(url, upgrade=True).close()  # the deployed layout: the store's tables beside
    threads = PROCRASTINATE_CREATE_THREADS

    def clear() -> None:
        # A given database is reused by the repeats (and by a retry after an overrun): the
        # same names with other due times would otherwise be idempotent no-ops.
        with psycopg.connect(conninfo_from_url(url), autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs")
            conn.execute("DELETE FROM sendqueue_parked_schedules")

    def create_all(scheduler: ProcrastinateScheduler, group: str, due: list[float]) -> None:
        def one(i: int) -> None:
            at = datetime.fromtimestamp(due[i], UTC).replace(tzinfo=None)
            scheduler.create(f"{group}-{i}", group, at, "UTC", {"i": str(i)}, f"t{i}", 2)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(due))))

    # Calibrate on throwaway schedules due well inside the horizon, so they take the same
    # path (a job, not a parked row); they are deleted before the run.
    calibrate_n = min(1000, max(100, total // 10))
    with ProcrastinateScheduler(url, pool_size=threads, reconcile_interval=None) as probe:
        clear()
        started = time.perf_counter()
        create_all(probe, "calibrate", [time.time() + 200.0] * calibrate_n)
        rate = calibrate_n / (time.perf_counter() - started)
    clear()
    extras = stack.enter_context(
        extra_workers("bench.dispatch", ["procrastinate-extra", "--store", url, *argv], n_extra)
    )
    lead = _lead(rate, total) * args.lead_factor
    scheduler = ProcrastinateScheduler(
        url,
        concurrency=args.concurrency,
        pool_size=threads,
        reconcile_interval=None,
        horizon=_procrastinate_horizon(lead, args),
    )
    t0 = time.time() + lead
    due = due_times(t0, args.schedules, args.spread, args.burst)
    created = time.perf_counter()
    create_all(scheduler, "bench", due)
    create_s = time.perf_counter() - created
    if time.time() > t0 - 0.2:
        scheduler.close()
        return {"overran": True, "create_s": create_s}
    recorder = _Recorder(total)
    stop = threading.Event()
    dispatcher = threading.Thread(
        target=scheduler.run, args=(lambda p: recorder.record(int(p["i"])), stop), daemon=True
    )
    cpu = cpu_seconds()
    extras.go()
    dispatcher.start()
    if args.workers == 1:
        recorder.done.wait(max(0.0, due[-1] - time.time()) + args.timeout)
    else:  # the others record their own fires: wait until no fire job is left
        deadline = due[-1] + args.timeout
        while time.time() < deadline and (time.time() < due[-1] or _fire_jobs_left(url)):
            time.sleep(0.1)
    cpu = cpu_seconds() - cpu
    stop.set()
    dispatcher.join(60)
    scheduler.close()
    for other in extras.stop():
        for index, at in other["fired"].items():
            recorder.fired[int(index)] = min(at, recorder.fired.get(int(index), at))
    return {
        **figures(due, recorder.fired, args.schedules, args.burst),
        "create_s": create_s,
        "creates_per_second": total / create_s,
        "cpu_s": cpu,
    }


def child_apscheduler(args: argparse.Namespace, home: Path, store: str) -> dict[str, Any]:
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    total = args.schedules + args.burst

    def jobstore(name: str) -> Any:
        if store == "memory":
            return MemoryJobStore()
        import sqlalchemy as sa

        engine = sa.create_engine(f"sqlite:///{home / name}")

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            # the journal settings sendqueue's files use, so neither pays more fsyncs
            dbapi_connection.execute("PRAGMA journal_mode = WAL")
            dbapi_connection.execute("PRAGMA synchronous = NORMAL")

        return SQLAlchemyJobStore(engine=engine)

    def scheduler(name: str) -> Any:
        return BackgroundScheduler(
            jobstores={"default": jobstore(name)},
            executors={"default": ThreadPoolExecutor(args.concurrency)},
            job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
            timezone=UTC,
        )

    global _RECORDER
    recorder = _RECORDER = _Recorder(total)
    # Calibrate the create rate on a throwaway scheduler (paused, so nothing runs).
    probe = scheduler("calibrate.sqlite")
    probe.start(paused=True)
    far = datetime(2099, 1, 1, tzinfo=UTC)
    started = time.perf_counter()
    for i in range(1000):
        probe.add_job(_fire, "date", run_date=far, args=[i], id=f"c{i}")
    rate = 1000 / (time.perf_counter() - started)
    probe.shutdown(wait=False)

    sched = scheduler("jobs.sqlite")
    sched.start(paused=True)
    t0 = time.time() + _lead(rate, total) * args.lead_factor
    due = due_times(t0, args.schedules, args.spread, args.burst)
    created = time.perf_counter()
    for i in range(total):
        sched.add_job(
            _fire,
            "date",
            run_date=datetime.fromtimestamp(due[i], UTC),
            args=[i],
            id=str(i),
        )
    create_s = time.perf_counter() - created
    if time.time() > t0 - 0.2:
        sched.shutdown(wait=False)
        return {"overran": True, "create_s": create_s}
    cpu = cpu_seconds()
    sched.resume()
    recorder.done.wait(max(0.0, due[-1] - time.time()) + args.timeout)
    cpu = cpu_seconds() - cpu
    sched.shutdown(wait=False)
    return {
        **figures(due, recorder.fired, args.schedules, args.burst),
        "create_s": create_s,
        "creates_per_second": total / create_s,
        "cpu_s": cpu,
    }


def child_full(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    """The whole path: dispatcher -> worker -> task store -> SMTP sink -> Finished."""
    from bench.sendpath import add_campaign, task_times, wait_sent
    from sendqueue.bootstrap import bootstrap
    from sendqueue.runtime import run_worker
    from sendqueue.settings import Settings

    store_url = args.store or f"sqlite:///{home / 'store.db'}"
    app = bootstrap(
        Settings(
            _env_file=None,
            database_url=store_url,
            scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
            mailer=f"smtp://127.0.0.1:{args.smtp_port}?security=none",
            worker_concurrency=args.concurrency,
            auto_pause_after=0,
        )
    )
    # Calibrate on the first schedules of a far-away copy? Simpler: the create rate of the
    # full path is the provisioning rate; a generous lead covers it.
    t0 = time.time() + args.full_lead
    due = due_times(t0, args.schedules, args.spread, args.burst)
    create_s = add_campaign(app, "bench", due)
    if time.time() > t0 - 0.2:
        app.close()
        return {"overran": True, "create_s": create_s}
    stop = threading.Event()
    worker = threading.Thread(
        target=run_worker,
        args=(app, stop),
        kwargs={"reconcile_at_start": False, "reconcile_interval": 3600},
        daemon=True,
    )
    cpu = cpu_seconds()
    worker.start()
    wait_sent(app, "bench", time.monotonic() + due[-1] + args.timeout - time.time(), every=0.5)
    cpu = cpu_seconds() - cpu
    stop.set()
    worker.join(60)
    claimed, finished = task_times(app, "bench")
    app.close()
    fire = figures(due, claimed, args.schedules, args.burst)
    sent = figures(due, finished, args.schedules, args.burst)
    return {
        **fire,
        **{f"sent_{k}": v for k, v in sent.items()},
        "create_s": create_s,
        "creates_per_second": len(due) / create_s,
        "cpu_s": cpu,
    }


# -- the parent ---------------------------------------------------------------------------------


def _child_args(
    schedules: int, spread: float, burst: int, concurrency: int, lead_factor: float
) -> list[str]:
    return [
        "--schedules", str(schedules), "--spread", str(spread), "--burst", str(burst),
        "--concurrency", str(concurrency), "--lead-factor", str(lead_factor),
    ]  # fmt: skip


def measure(variant: str, extra: list[str], base: list[str]) -> dict[str, Any]:
    """One child run; a run whose set-up overran the first due time is retried with a longer
    lead (the machine may be busier than the calibration showed)."""
    args = list(base)
    for _ in range(3):
        result = run_child("bench.dispatch", variant, *args, *extra, timeout=1800)
        if not result.get("overran"):
            return result
        factor = float(args[args.index("--lead-factor") + 1]) * 2
        args[args.index("--lead-factor") + 1] = str(factor)
    raise RuntimeError(f"{variant}: creating the schedules kept overrunning the first due time")


def _summaries(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = sorted({k for r in runs for k, v in r.items() if isinstance(v, int | float)})
    return {k: summarize([float(r[k]) for r in runs if k in r]).as_dict() for k in keys}


def run(
    *,
    schedules: int,
    spread: float,
    burst: int,
    repeats: int,
    concurrency: int,
    variants: tuple[str, ...] = VARIANTS,
    full_stores: tuple[str, ...] = (),
    smtp_port: int | None = None,
    procrastinate: str | None = None,
    procrastinate_workers: tuple[int, ...] = (1,),
) -> dict[str, Any]:
    """``full_stores``: task store URLs for ``sendqueue-full`` runs (needs ``smtp_port``).
    ``procrastinate``: also the ``procrastinate`` variant, on this empty PostgreSQL database,
    or ``""`` for a fresh database per run (created and dropped by the child); None: not run.
    ``procrastinate_workers``: one procrastinate row per number of worker processes
    (``procrastinate`` for one, ``procrastinate-2w`` for two...).
    """
    base = _child_args(schedules, spread, burst, concurrency, 1.0)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        (v, partial(measure, v, [], base)) for v in variants
    ]
    for n in () if procrastinate is None else procrastinate_workers:
        label = "procrastinate" if n == 1 else f"procrastinate-{n}w"
        runs[label] = []
        extra = ["--workers", str(n)] + (["--store", procrastinate] if procrastinate else [])
        steps.append((label, partial(measure, "procrastinate", extra, base)))
    for url in full_stores:
        label = "sendqueue-full-" + ("postgresql" if url.startswith("postgresql") else "sqlite")
        runs[label] = []
        extra = ["--smtp-port", str(smtp_port), "--store", url if "://" in url else ""]
        steps.append((label, partial(measure, "sendqueue-full", extra, base)))
    for n in range(repeats):
        for label, step in steps if n % 2 == 0 else list(reversed(steps)):
            runs[label].append(step())
    results = {label: _summaries(rs) for label, rs in runs.items()}
    out: dict[str, Any] = {
        "schedules": schedules,
        "spread_s": spread,
        "burst": burst,
        "repeats": repeats,
        "concurrency": concurrency,
        "anchors": ANCHORS,
        "variants": results,
        "targets": [],
    }
    sq = results.get("sendqueue")
    if sq is not None:
        p99 = sq["p99_ms"]["median"]
        drain = sq["burst_drain_s"]["median"]
        out["targets"] += [
            {
                "name": "dispatch p99 lateness <= 250 ms",
                "value": p99,
                "limit": P99_TARGET_MS,
                "unit": "ms",
                "passed": p99 <= P99_TARGET_MS and sq["missing"]["max"] == 0,
            },
            {
                "name": f"{burst:,}-burst drained in <= 5 s",
                "value": drain,
                "limit": BURST_TARGET_S,
                "unit": "s",
                "passed": drain <= BURST_TARGET_S and sq["missing"]["max"] == 0,
            },
        ]
        aps = results.get("apscheduler-sqlite")
        if aps is not None:
            for key, what in (("p99_ms", "p99 lateness"), ("burst_drain_s", "burst drain")):
                ours, theirs = sq[key]["median"], aps.get(key, {}).get("median", float("inf"))
                out["targets"].append(
                    {
                        "name": f"ahead of APScheduler's SQLite job store on {what}",
                        "value": ours / theirs if theirs else float("inf"),
                        "limit": 1.0,
                        "unit": "x",
                        "passed": ours < theirs,
                    }
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch")
    parser.add_argument(
        "variant", choices=[*VARIANTS, "sendqueue-full", "procrastinate", "procrastinate-extra"]
    )
    parser.add_argument("--schedules", type=int, required=True)
    parser.add_argument("--spread", type=float, required=True)
    parser.add_argument("--burst", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--lead-factor", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--smtp-port", type=int)
    parser.add_argument("--store", default="")
    parser.add_argument("--full-lead", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=1, help="procrastinate worker processes")
    args = parser.parse_args()
    # what the extra workers of the procrastinate variant are given (all but the variant)
    argv = _child_args(args.schedules, args.spread, args.burst, args.concurrency, 1.0)
    with tempfile.TemporaryDirectory(prefix="sq-bench-dispatch-") as tmp:
        home = Path(tmp)
        if args.variant == "sendqueue":
            result = child_sendqueue(args, home)
        elif args.variant == "sendqueue-full":
            if not args.full_lead:
                total = args.schedules + args.burst
                args.full_lead = (2.0 + total / 2000) * args.lead_factor
            result = child_full(args, home)
        elif args.variant == "procrastinate-extra":
            result = child_procrastinate_extra(args, args.store)
        elif args.variant == "procrastinate":
            if args.store:
                result = child_procrastinate(args, args.store, argv)
            else:
                with postgres_database() as url:
                    result = child_procrastinate(args, url, argv)
        else:
            result = child_apscheduler(args, home, args.variant.removeprefix("apscheduler-"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
