"""Benchmark 4 (and 7 on PostgreSQL): send throughput through the whole path.

sendqueue: ``emails`` tasks provisioned so that all are due (planned on a clock two hours
behind, then dispatched on the real one), then the worker process's loop, as ``sendqueue
worker`` runs it: the embedded dispatcher fires each schedule, the worker claims the task
(Pending -> Running), hands the message to SMTP, and records Finished. Throughput is
``emails`` over the time from the dispatcher's start to the last task's ``sent_at``.

With ``--execution pgqueuer`` the same send path behind the pgqueuer prototype
(:mod:`bench.pgqueuer_proto`, the measured alternative to procrastinate): the tasks
provisioned as above (their schedules written to an embedded scheduler that nothing runs), a
pgqueuer job due now for each enqueued in bulk on the store's PostgreSQL database, and one
pgqueuer worker (``concurrency`` threads) calling the same target.

With ``--execution procrastinate`` the same on the procrastinate execution layer, as
``SENDQUEUE_EXECUTION=procrastinate`` bootstraps it: the task store and procrastinate's jobs on
one PostgreSQL database, one worker process (procrastinate's worker, ``concurrency`` slots,
its 0.5 s poll and LISTEN/NOTIFY), and its periodic tasks (the reconciler among them) as they
run in a deployment. The backlog is all jobs when the clock starts (the parked schedules
promoted first), so a repeat on the same database measures what the first did.

Baseline: a raw ``smtplib`` loop on the same number of threads (``concurrency``), one
persistent connection per thread, sending the same number of comparable messages (built with
the standard library) into the same sink.

The sink is an aiosmtpd server in its own process (:func:`bench.common.smtp_sink`), so it
does not share a GIL with either sender. Each measurement runs in its own child process.
"""

from __future__ import annotations

import argparse
import json
import smtplib
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, run_child, summarize
from bench.workers import extra_workers, wait_for_line
from sendqueue.domain.policy import SendingPolicy, Window

__all__ = ["TARGETS", "run"]

#: The send throughput targets against the raw SMTP loop, by (execution layer, store): the
#: embedded layer on SQLite and on PostgreSQL, and procrastinate with one worker process.
TARGETS = {
    ("embedded", "sqlite"): 0.9,
    ("embedded", "postgresql"): 0.85,
    ("procrastinate", "postgresql"): 0.7,
}


class _ShiftedClock:
    """The real clock, ``shift`` behind: the plan made with it is due by the time it runs."""

    def __init__(self, shift: timedelta) -> None:
        self.shift = shift

    def now(self) -> datetime:
        return datetime.now(UTC) - self.shift


def _backlog_policy(start: datetime) -> SendingPolicy:
    """10,000 a day in a window from ``start`` (two hours back) to ten minutes past now: every
    send of a run (fewer than 9,000) is due when the worker starts, and the window is still
    open, so the worker sends the whole backlog (a send never leaves its window)."""
    first = start.hour * 60 + start.minute
    end = first + 130
    windows = [Window(first, min(end, 1440))]
    if end > 1440:
        windows.append(Window(0, end - 1440))
    return SendingPolicy(
        timezone="UTC", per_day=10_000, weekdays=frozenset(range(7)), windows=tuple(windows),
        start=start,
    )  # fmt: skip


def _settings(store_url: str, home: Path, port: int, concurrency: int, execution: str) -> Any:
    """``execution`` pgqueuer: the embedded layer's container (its dispatcher never runs)."""
    from sendqueue.settings import Settings

    return Settings(
        _env_file=None,
        database_url=store_url,
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        execution="embedded" if execution == "pgqueuer" else execution,
        mailer=f"smtp://127.0.0.1:{port}?security=none",
        worker_concurrency=concurrency,
        auto_pause_after=0,
        # the backlog below is up to two hours late by design: sent, not moved, and sent as
        # fast as the worker can (what is measured), not spaced out over the campaign's grid
        max_lateness=3 * 3600,
        space_late_sends=False,
    )


def _dispatching(
    app: Any,
    stop: threading.Event,
    execution: str,
    store_url: str,
    concurrency: int,
    *,
    first: bool,
) -> threading.Thread:
    """The thread of a worker process's loop: ``run_worker`` (the embedded dispatcher, as
    ``sendqueue worker`` runs it, or procrastinate's), or the pgqueuer prototype's worker.
    ``first``: the measured process (the embedded layer's reconciler kept out of its run)."""
    from bench.pgqueuer_proto import PgqueuerWorker
    from sendqueue.runtime import run_worker

    if execution == "pgqueuer":
        worker = PgqueuerWorker(store_url, concurrency=concurrency)
        return threading.Thread(target=worker.run, args=(app.invoke, stop), daemon=True)
    # procrastinate schedules the reconciler itself (a periodic task) and ignores these
    embedded = {"reconcile_at_start": False, "reconcile_interval": 3600}
    return threading.Thread(
        target=run_worker,
        args=(app, stop),
        kwargs=embedded if first and execution == "embedded" else {},
        daemon=True,
    )


def child_sendqueue(
    store_url: str,
    home: Path,
    port: int,
    emails: int,
    concurrency: int,
    execution: str = "embedded",
    workers: int = 1,
    handshake: bool = False,
) -> Any:
    """``workers``: worker processes in all (this one and ``workers - 1`` extra ones, started
    together once each is set up; procrastinate only). ``handshake`` (benchmark 15 runs this
    beside its webhook events): print ``ready`` once set up and start on the line ``go``; once
    every email is sent, print the result and keep the worker running (its webhook deliveries
    with it) until the line ``stop``."""
    from bench.pgqueuer_proto import enqueue_campaign
    from bench.sendpath import task_times, wait_sent
    from sendqueue.bootstrap import bootstrap
    from sendqueue.services.campaigns.demo import demo_csv
    from sendqueue.services.importing.recipients import Templates

    settings = _settings(store_url, home, port, concurrency, execution)
    past = _ShiftedClock(timedelta(hours=2))
    planner = bootstrap(settings, clock=past)
    created = planner.campaign_import.create(
        name="throughput",
        recipients=demo_csv(emails),
        policy=_backlog_policy(past.now()),
        templates=Templates(subject="Hello {{ name }}", body="Dear {{ name }} in {{ city }}"),
    )
    cid = created.campaign.id
    report = planner.provisioner.provision(cid)
    if report.status != "done":
        raise AssertionError(f"provisioning failed: {report}")
    planner.close()

    app = bootstrap(settings)
    app.store.get_campaign(cid)
    _ = app.scheduler, app.mailer
    if execution == "pgqueuer" and enqueue_campaign(app, store_url, cid) != emails:
        raise AssertionError("not every task was enqueued in pgqueuer")
    parked = _promote_backlog(app, store_url) if execution == "procrastinate" else 0
    stop = threading.Event()
    worker = _dispatching(app, stop, execution, store_url, concurrency, first=True)
    extra_args = [
        "worker", str(port), "0", str(concurrency), "--store", store_url, "--execution", execution
    ]  # fmt: skip
    if handshake:
        print("ready", flush=True)
        wait_for_line(sys.stdin, "go")
    with extra_workers("bench.throughput", extra_args, workers - 1) as extras:
        cpu = cpu_seconds()
        started = datetime.now(UTC)
        extras.go()
        worker.start()
        # polled once a second: the count is the harness's work, not the worker's (the rate is
        # taken from the tasks' sent_at, not from when the poll noticed)
        wait_sent(app, cid, time.monotonic() + 600, every=1.0)
        cpu = cpu_seconds() - cpu
        _, sent = task_times(app, cid)
        if len(sent) != emails:
            raise AssertionError(f"only {len(sent)} of {emails} emails finished")
        seconds = max(sent.values()) - started.timestamp()
        result = {
            "seconds": seconds,
            "per_second": emails / seconds,
            "cpu_s": cpu,
            "started": started.timestamp(),
            "parked_at_start": parked,
        }
        if handshake:
            print(json.dumps(result), flush=True)
            wait_for_line(sys.stdin, "stop")
        stop.set()
        worker.join(60)
        result["extra_workers_cpu_s"] = sum(r["cpu_s"] for r in extras.stop())
    app.close()
    return result


def _promote_backlog(app: Any, store_url: str) -> int:
    """Make every parked schedule of the backlog a job before the clock starts; returns how many
    are still parked (0). The plan, made two hours back, parks the schedules due past its
    horizon (300 s) though all are due now; in a deployment the promote ticks (every
    ``horizon / 5``) moved them long before. Left parked, they wait for the next tick: at once
    on a fresh database (a worker defers the last tick at start), up to a minute on a database
    whose last tick an earlier repeat took already (the 51-117/s second repeats)."""
    import psycopg

    from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
    from sendqueue.adapters.procrastinate.schema import conninfo_from_url

    scheduler = app.scheduler
    if not isinstance(scheduler, ProcrastinateScheduler):
        raise AssertionError(f"not the procrastinate scheduler: {type(scheduler).__name__}")
    scheduler.promote()
    with psycopg.connect(conninfo_from_url(store_url), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM sendqueue_parked_schedules").fetchone()
    return int(row[0]) if row else 0


def child_worker(store_url: str, home: Path, port: int, concurrency: int, execution: str) -> Any:
    """An extra worker process (``--workers``): set up, ``ready``, sends from ``go`` to
    ``stop`` (:mod:`bench.workers`), then its CPU seconds."""
    from sendqueue.bootstrap import bootstrap

    app = bootstrap(_settings(store_url, home, port, concurrency, execution))
    _ = app.scheduler, app.mailer, app.store
    stop = threading.Event()
    worker = _dispatching(app, stop, execution, store_url, concurrency, first=False)
    print("ready", flush=True)
    wait_for_line(sys.stdin, "go")
    cpu = cpu_seconds()
    worker.start()
    wait_for_line(sys.stdin, "stop")
    stop.set()
    worker.join(60)
    cpu = cpu_seconds() - cpu
    app.close()
    return {"cpu_s": cpu}


def child_raw(port: int, emails: int, concurrency: int) -> Any:
    share, extra = divmod(emails, concurrency)
    counts = [share + (1 if i < extra else 0) for i in range(concurrency)]
    errors: list[BaseException] = []

    def loop(n: int, first: int) -> None:
        try:
            with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
                smtp.ehlo("bench.example.com")
                for i in range(first, first + n):
                    msg = EmailMessage()
                    msg["From"] = "bench@example.com"
                    msg["To"] = f"Demo Recipient {i} <demo{i:03d}@example.com>"
                    msg["Subject"] = f"Hello Demo Recipient {i}"
                    msg["Date"] = format_datetime(datetime.now(UTC))
                    msg["Message-ID"] = make_msgid(domain="example.com")
                    msg.set_content(f"Dear Demo Recipient {i} in Berlin")
                    smtp.send_message(msg)
        except BaseException as exc:
            errors.append(exc)

    threads = []
    first = 0
    for n in counts:
        threads.append(threading.Thread(target=loop, args=(n, first)))
        first += n
    cpu = cpu_seconds()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    if errors:
        raise errors[0]
    return {"seconds": seconds, "per_second": emails / seconds, "cpu_s": cpu}


def run(
    *,
    emails: int,
    concurrency: int,
    repeats: int,
    port: int,
    store_urls: dict[str, str],
    executions: dict[str, str] | None = None,
    workers: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``store_urls``: label -> task store URL (``""`` for a fresh SQLite file per run).
    ``executions``: label -> execution layer (``embedded`` when absent). ``workers``: label ->
    worker processes (1 when absent). Rows with an entry in :data:`TARGETS` (one worker
    process) are judged against it; the others (more processes, pgqueuer) are reported."""
    layers = {label: (executions or {}).get(label, "embedded") for label in store_urls}
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], **{k: [] for k in store_urls}}
    steps = [("raw", lambda: run_child("bench.throughput", "raw", str(port), str(emails),
                                       str(concurrency)))]  # fmt: skip
    for label, url in store_urls.items():
        steps.append(
            (
                label,
                partial(
                    run_child,
                    "bench.throughput",
                    "sendqueue",
                    str(port),
                    str(emails),
                    str(concurrency),
                    "--store",
                    url,
                    "--execution",
                    layers[label],
                    "--workers",
                    str((workers or {}).get(label, 1)),
                ),
            )
        )
    for n in range(repeats):
        for label, step in steps if n % 2 == 0 else list(reversed(steps)):
            runs[label].append(step())
    raw_rate = summarize([r["per_second"] for r in runs["raw"]])
    out: dict[str, Any] = {
        "emails": emails,
        "concurrency": concurrency,
        "repeats": repeats,
        "raw_per_second": raw_rate.as_dict(),
        "raw_cpu_seconds": summarize([r["cpu_s"] for r in runs["raw"]]).as_dict(),
        "variants": {},
        "targets": [],
    }
    for label in store_urls:
        rate = summarize([r["per_second"] for r in runs[label]])
        ratio = rate.median / raw_rate.median
        out["variants"][label] = {
            "per_second": rate.as_dict(),
            "seconds": summarize([r["seconds"] for r in runs[label]]).as_dict(),
            "cpu_seconds": summarize([r["cpu_s"] for r in runs[label]]).as_dict(),
            "ratio": ratio,
            "execution": layers[label],
            "workers": (workers or {}).get(label, 1),
            # schedules still parked when the clock started, most of any repeat (procrastinate)
            "parked_at_start": max(r.get("parked_at_start", 0) for r in runs[label]),
        }
        store = "postgresql" if store_urls[label] else "sqlite"
        target = TARGETS.get((layers[label], store))
        if target is None or (workers or {}).get(label, 1) != 1:
            continue
        out["targets"].append(
            {
                "name": f"send throughput >= {target:g}x the raw SMTP loop ({label})",
                "value": ratio,
                "limit": target,
                "unit": "x",
                "passed": ratio >= target,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput")
    parser.add_argument("side", choices=["sendqueue", "raw", "worker"])
    parser.add_argument("port", type=int)
    parser.add_argument("emails", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--store", default="")
    parser.add_argument(
        "--execution", choices=["embedded", "procrastinate", "pgqueuer"], default="embedded"
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--handshake", action="store_true", help="ready / go / stop on stdio")
    args = parser.parse_args()
    if args.side == "raw":
        result = child_raw(args.port, args.emails, args.concurrency)
    elif args.side == "worker":
        with tempfile.TemporaryDirectory(prefix="sq-bench-worker-") as tmp:
            result = child_worker(
                args.store, Path(tmp), args.port, args.concurrency, args.execution
            )
    else:
        with tempfile.TemporaryDirectory(prefix="sq-bench-send-") as tmp:
            home = Path(tmp)
            url = args.store or f"sqlite:///{home / 'store.db'}"
            result = child_sendqueue(
                url, home, args.port, args.emails, args.concurrency, args.execution, args.workers,
                handshake=args.handshake,
            )  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
