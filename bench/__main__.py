"""``python -m bench``: every benchmark against its anchor, side by side, in one run.

Writes ``bench/results.json`` (machine facts, every figure, every ratio, pass/fail per target)
and ``bench/results.md`` (the table), and prints the table. Sizes are flags; the defaults
finish in about a quarter of an hour on two cores. ``make bench BENCH_ARGS="..."`` passes
flags through. See docs/performance.md for what each benchmark measures.

A missed target is reported, not raised: the exit status is 0 unless a benchmark itself
broke. PostgreSQL that cannot be reached is recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import (
    capacity,
    changelog,
    dispatch,
    feedback,
    feedback_parse,
    fleet,
    imports,
    pgqueuer_proto,
    planner,
    provisioning,
    reconciler,
    sequences,
    stream,
    suppressions,
    throughput,
    webhooks,
)
from bench.common import (
    ROOT,
    machine_facts,
    postgres_database,
    postgres_skip_reason,
    smtp_sink,
)
from bench.fleetproc import sigterm_exits
from bench.report import render_markdown, summary_rows

BENCHMARKS = (
    "planner",
    "capacity",
    "provisioning",
    "dispatch",
    "throughput",
    "queues",
    "fleet",
    "reconciler",
    "stream",
    "imports",
    "suppressions",
    "changelog",
    "feedback",
    "feedback_parse",
    "webhooks",
    "sequences",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run only these")
    p.add_argument("--repeats", type=int, default=3, help="measurements per figure (3)")
    p.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL runs")
    p.add_argument("--out", type=Path, default=ROOT / "bench", help="where results go")
    g = p.add_argument_group("sizes")
    g.add_argument("--planner-sends", type=int, default=1_000_000)
    g.add_argument("--capacity-sends", type=int, default=100_000,
                   help="capacity planner: sends planned (beside plan() of as many)")  # fmt: skip
    g.add_argument("--capacity-senders", type=int, default=100)
    g.add_argument("--capacity-bookings", type=int, default=50_000,
                   help="capacity planner: bookings already in the senders' books")  # fmt: skip
    g.add_argument("--capacity-repeats", type=int, default=11,
                   help="capacity planner and its plan() anchor, alternately (11: a run is "
                        "a tenth of a second, so a burst of load elsewhere hits few)")  # fmt: skip
    g.add_argument("--import-rows", type=int, nargs=2, default=[20_000, 80_000],
                   help="two CSV sizes; the import's peak RSS is scaled to 1M rows")  # fmt: skip
    g.add_argument("--suppression-rows", type=int, nargs=2, default=[50_000, 200_000],
                   help="two suppression CSV sizes (benchmark 13)")  # fmt: skip
    g.add_argument("--recipients", type=int, default=100_000)
    g.add_argument("--recipients-small", type=int, default=10_000)
    g.add_argument("--provision-repeats", type=int, default=None, help="default: --repeats")
    g.add_argument("--schedules", type=int, default=10_000)
    g.add_argument("--spread", type=float, default=20.0, help="seconds the schedules span")
    g.add_argument("--burst", type=int, default=2_000)
    g.add_argument("--dispatch-repeats", type=int, default=2)
    g.add_argument("--throughput-repeats", type=int, default=1)
    g.add_argument("--postgres-repeats", type=int, default=1, help="provisioning on PostgreSQL")
    g.add_argument("--full-path-dispatch", action="store_true",
                   help="also the whole send path at the dispatch set's pace")  # fmt: skip
    g.add_argument("--emails", type=int, default=5_000)
    g.add_argument("--concurrency", type=int, default=4, help="threads sending / firing")
    g.add_argument("--fleet-workers", type=int, nargs="+", default=list(fleet.DEFAULT_WORKERS),
                   help="worker processes per fleet row (1 2 4)")  # fmt: skip
    g.add_argument("--fleet-emails", type=int, default=2_000, help="fleet throughput backlog")
    g.add_argument("--fleet-rate", type=float, default=200.0, help="fleet dispatch: due/s")
    g.add_argument("--fleet-spread", type=float, default=10.0, help="fleet dispatch: seconds")
    g.add_argument("--fleet-burst", type=int, default=2_000)
    g.add_argument("--fleet-waiting", type=int, default=20_000,
                   help="jobs waiting in procrastinate for the second pass (0: none)")  # fmt: skip
    g.add_argument("--noop-jobs", type=int, default=5_000,
                   help="queues: no-op jobs per run (fire loop against pgqueuer)")  # fmt: skip
    g.add_argument("--workers", type=int, nargs="+", default=[1],
                   help="procrastinate worker processes, one row per count")  # fmt: skip
    g.add_argument("--reconcile-small", type=int, default=100_000)
    g.add_argument("--reconcile-large", type=int, default=1_000_000)
    g.add_argument("--reconcile-pending", type=int, default=10_000)
    g.add_argument("--reconcile-missing", type=int, default=1_000)
    g.add_argument("--stream-clients", type=int, default=100)
    g.add_argument("--stream-changes", type=int, default=1_000)
    g.add_argument("--stream-seconds", type=float, default=10.0)
    g.add_argument("--changelog-writers", type=int, default=8, help="writer threads (8)")
    g.add_argument("--changelog-per-writer", type=int, default=300,
                   help="tasks each writer claims and finishes (2 transactions each)")  # fmt: skip
    g.add_argument("--feedback-messages", type=int, default=200,
                   help="feedback poll memory: messages in the mailbox (200)")  # fmt: skip
    g.add_argument("--feedback-size", type=int, default=feedback.MIB,
                   help="feedback poll memory: bytes per message (1 MiB)")  # fmt: skip
    g.add_argument("--feedback-hostile", type=int, default=3,
                   help="API during a hostile poll: hostile messages, then the reply")  # fmt: skip
    g.add_argument("--feedback-hostile-size", type=int, default=feedback.MIB)
    g.add_argument("--feedback-before", type=float, default=10.0,
                   help="API during a hostile poll: seconds timed before (10)")  # fmt: skip
    g.add_argument("--feedback-during", type=float, default=30.0,
                   help="API during a hostile poll: most seconds timed during (30)")  # fmt: skip
    g.add_argument("--feedback-bytes", type=int, default=feedback_parse.SIZE,
                   help="feedback parse: bytes per hostile message (1 MiB)")  # fmt: skip
    g.add_argument("--sequence-emails", type=int, default=5_000,
                   help="sequences: step-1 sends of each campaign (one step, 3 steps), "
                        "benchmark 4's backlog")  # fmt: skip
    g.add_argument("--sequence-recipients", type=int, default=100_000,
                   help="sequences: recipients of the 3-step sequence provisioned")  # fmt: skip
    g.add_argument("--sequence-repeats", type=int, default=1)
    g.add_argument("--webhook-rate", type=float, default=1_000.0, help="webhooks: events/s made")
    g.add_argument("--webhook-seconds", type=float, default=10.0,
                   help="webhooks: seconds of events made with no sends beside them")  # fmt: skip
    g.add_argument("--webhook-backlog-seconds", type=int, default=600,
                   help="webhooks: the backlog is this many seconds of events at the rate "
                        "(600: the target's 10 minutes)")  # fmt: skip
    g.add_argument("--webhook-poll", type=float, default=webhooks.POLL,
                   help="webhooks: the delivery loop's poll interval, seconds (0.05; the "
                        "product's default is 0.5)")  # fmt: skip
    g.add_argument("--webhook-requests", type=int, default=20_000,
                   help="webhooks: requests sent to each receiver alone")  # fmt: skip
    return p.parse_args(argv)


def _procrastinate_status(pg_reason: str | None) -> str | None:
    """None when the procrastinate rows can run here; else why not (PostgreSQL's reason first:
    procrastinate lives on it)."""
    if pg_reason:
        return pg_reason
    if importlib.util.find_spec("procrastinate") is None:
        return "procrastinate is not installed (pip install -e '.[procrastinate]')"
    return None


def _pgqueuer_status(pg_reason: str | None) -> str | None:
    """None when the pgqueuer prototype's rows can run here; else why not."""
    if pg_reason:
        return pg_reason
    for module in ("pgqueuer", "asyncpg"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[bench]')"
    return None


def _feedback_steps(args: argparse.Namespace) -> list[tuple[str, Callable[[], Any]]]:
    """Benchmarks 11 and 12 (bench/feedback.py), as named steps of the run."""
    return [
        (
            "feedback_memory",
            lambda: feedback.run_memory(
                messages=args.feedback_messages, size=args.feedback_size, repeats=1
            ),
        ),
        (
            "feedback_api",
            lambda: feedback.run_api(
                hostile=args.feedback_hostile,
                hostile_size=args.feedback_hostile_size,
                before_seconds=args.feedback_before,
                during_seconds=args.feedback_during,
                repeats=1,
            ),
        ),
    ]


def _sequences(
    args: argparse.Namespace, attempt: Callable[[str, Callable[[], Any]], None], proc: str | None
) -> None:
    """Benchmark 16: a 3-step campaign's sends against a one-step campaign's, on the embedded
    layer (SQLite) and on procrastinate (a database per campaign kind); its provisioning."""

    def run_throughput() -> Any:
        with ExitStack() as stack:
            port = stack.enter_context(smtp_sink())
            layers: dict[str, tuple[str, ...]] = {"embedded, SQLite": ("embedded", "", "")}
            if not proc:
                urls = [stack.enter_context(postgres_database()) for _ in range(2)]
                layers["procrastinate, PostgreSQL"] = ("procrastinate", *urls)
            return sequences.run_throughput(
                emails=args.sequence_emails,
                concurrency=args.concurrency,
                repeats=args.sequence_repeats,
                port=port,
                layers=layers,
            )

    attempt("sequences_throughput", run_throughput)
    attempt(
        "sequences_provisioning",
        lambda: sequences.run_provisioning(
            recipients=args.sequence_recipients, repeats=args.sequence_repeats
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = set(args.only or BENCHMARKS)
    repeats = args.repeats
    results: dict[str, Any] = {"machine": machine_facts(), "benchmarks": {}, "errors": {}}
    pg_reason = "disabled with --no-postgres" if args.no_postgres else postgres_skip_reason()
    results["postgres"] = {"skipped": pg_reason} if pg_reason else {"url": "127.0.0.1:5432"}
    proc_reason = _procrastinate_status(pg_reason)
    results["procrastinate"] = {"skipped": proc_reason} if proc_reason else {"ran": True}
    pgq_reason = _pgqueuer_status(pg_reason)
    results["pgqueuer"] = {"skipped": pgq_reason} if pgq_reason else {"ran": True}
    started = time.monotonic()
    out: dict[str, Any] = results["benchmarks"]

    def attempt(name: str, step: Callable[[], Any]) -> None:
        print(f"[bench] {name} ...", flush=True, file=sys.stderr)
        t0 = time.monotonic()
        try:
            out[name] = step()
        except Exception as exc:
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"[bench] {name} done in {time.monotonic() - t0:.0f} s", flush=True, file=sys.stderr)

    if "planner" in chosen:
        attempt("planner", lambda: planner.run(sends=args.planner_sends, repeats=repeats))
    if "capacity" in chosen:
        attempt(
            "capacity",
            lambda: capacity.run(
                sends=args.capacity_sends,
                senders_count=args.capacity_senders,
                booked=args.capacity_bookings,
                repeats=args.capacity_repeats,
            ),
        )
    prov_repeats = args.provision_repeats or repeats
    if "provisioning" in chosen:
        attempt(
            "provisioning",
            lambda: provisioning.run(
                recipients=args.recipients, small=args.recipients_small, repeats=prov_repeats
            ),
        )
        attempt(
            "provisioning_senders",
            lambda: provisioning.run(
                recipients=args.recipients,
                small=args.recipients_small,
                repeats=prov_repeats,
                senders=provisioning.SENDERS,
            ),
        )
        if not pg_reason:
            attempt(
                "provisioning_postgresql",
                lambda: provisioning.run(
                    recipients=args.recipients,
                    small=args.recipients_small,
                    repeats=args.postgres_repeats,
                    postgres=True,
                ),
            )
        if not proc_reason:
            attempt(
                "provisioning_procrastinate",
                lambda: provisioning.run(
                    recipients=args.recipients,
                    small=args.recipients_small,
                    repeats=args.postgres_repeats,
                    execution="procrastinate",
                ),
            )
    if "dispatch" in chosen:

        def run_dispatch() -> Any:
            with ExitStack() as stack:
                stores: list[str] = []
                port = None
                if args.full_path_dispatch:
                    port = stack.enter_context(smtp_sink())
                    stores.append("sqlite")
                    if not pg_reason:
                        stores.append(stack.enter_context(postgres_database()))
                return dispatch.run(
                    schedules=args.schedules,
                    spread=args.spread,
                    burst=args.burst,
                    repeats=args.dispatch_repeats,
                    concurrency=args.concurrency,
                    full_stores=tuple(stores),
                    smtp_port=port,
                    # a fresh database per run, created and dropped by the child
                    procrastinate=None if proc_reason else "",
                    procrastinate_workers=tuple(args.workers),
                )

        attempt("dispatch", run_dispatch)
    if "throughput" in chosen:

        def run_throughput() -> Any:
            with ExitStack() as stack:
                port = stack.enter_context(smtp_sink())
                stores = {"sendqueue (SQLite store)": ""}
                if not pg_reason:
                    stores["sendqueue (PostgreSQL store)"] = "postgres"
                executions = {}
                workers = {}
                for n in [] if proc_reason else args.workers:
                    label = "sendqueue (procrastinate execution, PostgreSQL)"
                    if n > 1:
                        label = label[:-1] + f", {n} worker processes)"
                    stores[label] = "postgres"
                    executions[label] = "procrastinate"
                    workers[label] = n
                if not pgq_reason:  # the measured pgqueuer alternative, beside the layers
                    label = "pgqueuer prototype, PostgreSQL store"
                    stores[label] = "postgres"
                    executions[label] = "pgqueuer"
                urls = {}
                for label, kind in stores.items():
                    urls[label] = stack.enter_context(postgres_database()) if kind else ""
                return throughput.run(
                    emails=args.emails,
                    concurrency=args.concurrency,
                    port=port,
                    store_urls=urls,
                    executions=executions,
                    workers=workers,
                    repeats=args.throughput_repeats,
                )

        attempt("throughput", run_throughput)
    if "queues" in chosen and not (pgq_reason or proc_reason):
        attempt(
            "queues",
            lambda: pgqueuer_proto.run_noop(
                jobs=args.noop_jobs,
                concurrency=args.concurrency,
                repeats=args.throughput_repeats,
                database=postgres_database,
            ),
        )
    if "fleet" in chosen:

        def run_fleet() -> Any:
            with sigterm_exits(), ExitStack() as stack:
                port = stack.enter_context(smtp_sink())
                # one fresh database for every procrastinate row, dropped afterwards
                url = None if proc_reason else stack.enter_context(postgres_database())
                return fleet.run(
                    emails=args.fleet_emails,
                    rate=args.fleet_rate,
                    spread=args.fleet_spread,
                    burst=args.fleet_burst,
                    waiting=args.fleet_waiting,
                    concurrency=args.concurrency,
                    port=port,
                    postgres_url=url,
                    workers=tuple(args.fleet_workers),
                )

        attempt("fleet", run_fleet)
    if "reconciler" in chosen:
        attempt(
            "reconciler",
            lambda: reconciler.run(
                small=args.reconcile_small,
                large=args.reconcile_large,
                pending=args.reconcile_pending,
                missing=args.reconcile_missing,
                repeats=repeats,
            ),
        )
    if "stream" in chosen:
        attempt(
            "stream",
            lambda: stream.run(
                clients=args.stream_clients,
                changes=args.stream_changes,
                seconds=args.stream_seconds,
                repeats=repeats,
            ),
        )
    if "imports" in chosen:
        attempt("imports", lambda: imports.run((args.import_rows[0], args.import_rows[1])))
    if "webhooks" in chosen:
        attempt(
            "webhooks",
            lambda: webhooks.run(
                rate=args.webhook_rate,
                seconds=args.webhook_seconds,
                backlog_seconds=args.webhook_backlog_seconds,
                emails=args.emails,
                concurrency=args.concurrency,
                poll=args.webhook_poll,
                requests=args.webhook_requests,
            ),
        )
    if "suppressions" in chosen:
        sizes = (args.suppression_rows[0], args.suppression_rows[1])
        attempt("suppressions", lambda: suppressions.run(sizes))
    if "changelog" in chosen and not pg_reason:
        attempt(
            "changelog",
            lambda: changelog.run(
                database=postgres_database,
                writers=args.changelog_writers,
                per_writer=args.changelog_per_writer,
                repeats=repeats,
            ),
        )
    if "feedback" in chosen:  # each skipped with the reason when Dovecot is missing
        for name, step in _feedback_steps(args):
            attempt(name, step)
    if "feedback_parse" in chosen:
        attempt(
            "feedback_parse",
            lambda: feedback_parse.run(size=args.feedback_bytes, repeats=repeats),
        )
    if "sequences" in chosen:
        _sequences(args, attempt, proc_reason)
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    results["seconds"] = time.monotonic() - started
    results["arguments"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results["targets"] = [t for b in out.values() for t in b.get("targets", [])]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    markdown = render_markdown(results)
    (args.out / "results.md").write_text(markdown)
    print(markdown)
    for line in summary_rows(results):
        print(line, file=sys.stderr)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
