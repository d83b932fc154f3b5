"""Every benchmark once, at tiny sizes: each must run and produce well-formed figures.

No timing is asserted (the figures of a tiny run mean nothing); the real run is ``make bench``.
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bench.common import percentile, postgres_database, smtp_sink, summarize
from bench.report import render_markdown

from bench import __main__ as bench_main
from bench import (
    capacity,
    changelog,
    changelog_pgbench,
    dispatch,
    feedback,
    feedback_parse,
    fleet,
    hostile_mail,
    pgqueuer_proto,
    planner,
    provisioning,
    reconciler,
    stream,
    suppressions,
    throughput,
    webhooks,
)

# One xdist group with tests/integration/test_procrastinate.py: both open many PostgreSQL
# connections, and the server allows a hundred in all.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("many-connections")]

_MACHINE = {
    "cpu_count": 1,
    "cpu_model": "test",
    "python": "3",
    "sqlite": "3",
    "load_average_at_start": [0.0, 0.0, 0.0],
}


def _summary(fig: Any) -> None:
    assert set(fig) == {"median", "min", "max", "values"}
    assert fig["values"], fig
    assert all(math.isfinite(v) for v in fig["values"])
    assert fig["min"] <= fig["median"] <= fig["max"]


def _targets(result: dict[str, Any]) -> None:
    assert result["targets"]
    for target in result["targets"]:
        assert set(target) == {"name", "value", "limit", "unit", "passed"}
        assert isinstance(target["passed"], bool)
        assert math.isfinite(target["value"])


def test_summaries_and_percentiles() -> None:
    assert summarize([3.0, 1.0, 2.0]).as_dict() == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "values": [3.0, 1.0, 2.0],
    }
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0


def test_planner() -> None:
    result = planner.run(sends=3_000, repeats=2)
    _summary(result["sendqueue_ns_per_send"])
    _summary(result["baseline_ns_per_send"])
    assert result["ratio"] > 0
    _targets(result)
    assert len(planner.naive_baseline(5)) == 5


def test_capacity() -> None:
    result = capacity.run(sends=2_000, senders_count=10, booked=500, repeats=2)
    _summary(result["sendqueue_us_per_send"])
    _summary(result["plan_us_per_send"])
    assert result["ratio"] > 0
    assert (result["sends"], result["senders"], result["bookings"]) == (2_000, 10, 500)
    _targets(result)
    assert result["targets"][0]["passed"] == (result["ratio"] <= capacity.TARGET)
    table = render_markdown(
        {"machine": _MACHINE, "benchmarks": {"capacity": result}, "targets": result["targets"]}
    )
    assert "| 10 capacity planner, 2,000 sends, 10 senders, 500 bookings: µs/send |" in table
    assert "| capacity planner within 5x plan() per send |" in table


def test_feedback_parse_of_every_hostile_shape() -> None:
    result = feedback_parse.run(size=4_096, repeats=1)
    assert set(result["shapes"]) == {*hostile_mail.SHAPES, hostile_mail.CONTROL}
    for fig in result["shapes"].values():
        _summary(fig["seconds"])
        _summary(fig["cpu_seconds"])
        assert 0 < fig["bytes"] <= 4_096
        assert fig["vs_control"] > 0
    assert len(result["targets"]) == len(hostile_mail.SHAPES)
    _targets(result)
    table = render_markdown(
        {
            "machine": _MACHINE,
            "benchmarks": {"feedback_parse": result},
            "targets": result["targets"],
        }
    )
    assert "| 14 feedback parse, hostile 4,096 B message: s (from_addresses) |" in table
    assert "| feedback parse of a hostile 4,096 B message at most 0.5 s (many_parts) |" in table


def test_the_runner_runs_the_feedback_parse_benchmark(tmp_path: Path) -> None:
    argv = ["--only", "feedback_parse", "--repeats", "1", "--feedback-bytes", "2048"]
    assert bench_main.main([*argv, "--no-postgres", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["benchmarks"]) == {"feedback_parse"}
    assert len(results["targets"]) == len(hostile_mail.SHAPES)


def test_provisioning() -> None:
    result = provisioning.run(recipients=300, small=100, repeats=1)
    for key in ("sendqueue_per_second", "raw_per_second", "peak_rss_mb_large", "peak_rss_mb_small"):
        _summary(result[key])
    assert result["ratio"] > 0
    assert [t["unit"] for t in result["targets"]] == ["x", "MB"]
    _targets(result)


@pytest.mark.postgres
def test_provisioning_on_procrastinate_beside_one_create_at_a_time() -> None:
    result = provisioning.run(recipients=300, small=100, repeats=1, execution="procrastinate")
    for key in (
        "sendqueue_per_second",
        "raw_per_second",
        "small_per_second",
        "one_at_a_time_per_second",
        "raw_small_per_second",
    ):
        _summary(result[key])
    assert result["ratio"] > 0 and result["one_at_a_time_ratio"] > 0
    assert (result["store"], result["execution"]) == ("PostgreSQL", "procrastinate")
    assert [t["unit"] for t in result["targets"]] == ["x"]
    _targets(result)
    table = render_markdown(
        {
            "machine": _MACHINE,
            "benchmarks": {"provisioning_procrastinate": result},
            "errors": {},
            "targets": result["targets"],
        }
    )
    assert "one create at a time, as before create_many" in table


def test_dispatch_against_apscheduler() -> None:
    result = dispatch.run(schedules=200, spread=1.0, burst=50, repeats=1, concurrency=2)
    assert set(result["variants"]) == set(dispatch.VARIANTS)
    for figures in result["variants"].values():
        for key in ("p50_ms", "p99_ms", "max_ms", "burst_drain_s", "creates_per_second"):
            _summary(figures[key])
        assert figures["missing"]["max"] == 0
    assert len(result["targets"]) == 4
    _targets(result)


def test_dispatch_full_path() -> None:
    with smtp_sink() as port:
        result = dispatch.run(
            schedules=40,
            spread=1.0,
            burst=10,
            repeats=1,
            concurrency=2,
            variants=(),
            full_stores=("sqlite",),
            smtp_port=port,
        )
    figures = result["variants"]["sendqueue-full-sqlite"]
    for key in ("p99_ms", "sent_p99_ms", "burst_drain_s"):
        _summary(figures[key])
    assert figures["missing"]["max"] == 0


@pytest.mark.postgres
def test_dispatch_procrastinate(postgres_url: str) -> None:
    result = dispatch.run(
        schedules=60,
        spread=1.0,
        burst=15,
        repeats=1,
        concurrency=2,
        variants=(),
        procrastinate=postgres_url,
    )
    assert set(result["variants"]) == {"procrastinate"}
    figures = result["variants"]["procrastinate"]
    for key in ("p50_ms", "p99_ms", "max_ms", "burst_drain_s", "creates_per_second"):
        _summary(figures[key])
    assert figures["missing"]["max"] == 0
    assert result["targets"] == []  # the embedded layer's targets; none set for procrastinate
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"dispatch": result}})
    assert "(procrastinate execution layer, PostgreSQL, 1 worker) |" in rows


@pytest.mark.postgres
def test_dispatch_procrastinate_with_two_worker_processes(postgres_url: str) -> None:
    result = dispatch.run(
        schedules=60,
        spread=1.0,
        burst=15,
        repeats=1,
        concurrency=2,
        variants=(),
        procrastinate=postgres_url,
        procrastinate_workers=(2,),
    )
    figures = result["variants"]["procrastinate-2w"]
    for key in ("p50_ms", "p99_ms", "burst_drain_s"):
        _summary(figures[key])
    assert figures["missing"]["max"] == 0  # the other process's fires are counted too
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"dispatch": result}})
    assert "(procrastinate execution layer, PostgreSQL, 2 worker processes) |" in rows


def test_throughput() -> None:
    with smtp_sink() as port:
        result = throughput.run(
            emails=30, concurrency=2, repeats=1, port=port, store_urls={"sendqueue": ""}
        )
    _summary(result["raw_per_second"])
    _summary(result["variants"]["sendqueue"]["per_second"])
    _targets(result)


@pytest.mark.postgres
def test_throughput_procrastinate(postgres_url: str) -> None:
    with smtp_sink() as port:
        result = throughput.run(
            emails=30,
            concurrency=2,
            repeats=1,
            port=port,
            store_urls={"sendqueue (procrastinate)": postgres_url},
            executions={"sendqueue (procrastinate)": "procrastinate"},
        )
    figures = result["variants"]["sendqueue (procrastinate)"]
    _summary(figures["per_second"])
    assert figures["execution"] == "procrastinate"
    assert figures["ratio"] > 0
    # one worker process: judged against the procrastinate layer's target
    assert [t["limit"] for t in result["targets"]] == [
        throughput.TARGETS["procrastinate", "postgresql"]
    ]
    _targets(result)


@pytest.mark.postgres
def test_throughput_procrastinate_repeats_start_with_no_schedule_parked(postgres_url: str) -> None:
    # 450 emails: the plan, made two hours back, parks those due past its 300 s horizon (about
    # 65). Left parked, a second repeat on the same database waited for the next promote tick.
    label = "sendqueue (procrastinate)"
    with smtp_sink() as port:
        result = throughput.run(
            emails=450,
            concurrency=2,
            repeats=2,  # on one database, back to back: within one promote tick
            port=port,
            store_urls={label: postgres_url},
            executions={label: "procrastinate"},
        )
    figures = result["variants"][label]
    assert len(figures["per_second"]["values"]) == 2
    assert figures["parked_at_start"] == 0


@pytest.mark.postgres
def test_throughput_pgqueuer_prototype(postgres_url: str) -> None:
    label = "pgqueuer prototype"
    with smtp_sink() as port:
        result = throughput.run(
            emails=30,
            concurrency=2,
            repeats=2,  # the repeats share the database: pgqueuer's schema goes in once
            port=port,
            store_urls={label: postgres_url},
            executions={label: "pgqueuer"},
        )
    figures = result["variants"][label]
    _summary(figures["per_second"])  # the child raises unless all 30 were sent
    assert (figures["execution"], figures["workers"]) == ("pgqueuer", 1)
    assert result["targets"] == []  # a measurement, not a layer: no target


@pytest.mark.postgres
def test_queues_alone_with_a_noop_job() -> None:
    result = pgqueuer_proto.run_noop(jobs=40, concurrency=2, repeats=1, database=postgres_database)
    assert set(result["queues"]) == set(pgqueuer_proto.QUEUES)
    for figures in result["queues"].values():
        _summary(figures["per_second"])
        _summary(figures["cpu_ms_per_job"])
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"queues": result}})
    assert "4q queue alone, 40 no-op jobs, 2 threads" in rows
    assert "(pgqueuer, asyncpg, job on a thread) |" in rows


def _worker_children() -> list[str]:
    """The command lines of this process's children that are ``sendqueue worker`` processes."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and "sendqueue.cli worker" in cmdline:
            found.append(cmdline)
    return found


def _fleet(postgres_url: str | None, workers: tuple[int, ...]) -> dict[str, Any]:
    with smtp_sink() as port:
        result = fleet.run(
            emails=20,
            rate=20.0,
            spread=1.0,
            burst=10,
            waiting=30,
            concurrency=2,
            port=port,
            postgres_url=postgres_url,
            workers=workers,
        )
    assert _worker_children() == []  # every worker process was stopped
    assert len(result["raw_per_second"]) == 2  # the raw loop before and after
    for row in result["rows"]:
        usage = row["usage"]
        assert len(usage["worker_cpu_s"]) == row["workers"]
        assert 0 <= usage["machine_busy_percent"] <= 100
        if row["kind"] == "throughput":
            assert row["per_second"] > 0 and row["vs_raw"] > 0
        else:
            assert row["missing"] == 0 and row["sent_missing"] == 0
            assert row["p99_ms"] <= row["max_ms"]
            assert row["burst_drain_s"] >= 0
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"fleet": result}})
    assert "9 fleet throughput, 20 due emails: /s (embedded, 1 process) |" in rows
    return result


def test_fleet_embedded_only() -> None:
    result = _fleet(None, (1, 2))
    assert [(r["layer"], r["workers"], r["kind"]) for r in result["rows"]] == [
        ("embedded", 1, "throughput"),
        ("embedded", 1, "dispatch"),
    ]
    assert result["targets"] == []  # the fleet targets are the procrastinate layer's


@pytest.mark.postgres
def test_fleet_procrastinate(postgres_url: str) -> None:
    result = _fleet(postgres_url, (1, 2))
    procrastinate = [r for r in result["rows"] if r["layer"] == "procrastinate"]
    assert [(r["workers"], r["waiting"], r["kind"]) for r in procrastinate] == [
        (n, held, kind) for held in (0, 30) for n in (1, 2) for kind in ("throughput", "dispatch")
    ]
    assert result["waiting_set"]["jobs_waiting"] == 30
    for row in procrastinate:
        connections = row["usage"]["connections_max"]
        assert len(connections) == row["workers"]
        assert all(n >= 1 for n in connections.values())  # each worker seen by its name
        assert row["usage"]["postgres_cpu_s"] >= 0
    two = next(r for r in procrastinate if r["kind"] == "throughput" and r["workers"] == 2)
    assert two["vs_one_process"] > 0
    assert len(result["targets"]) == 4
    _targets(result)


@pytest.mark.postgres
def test_throughput_procrastinate_with_two_worker_processes(postgres_url: str) -> None:
    label = "sendqueue (procrastinate, 2 worker processes)"
    with smtp_sink() as port:
        result = throughput.run(
            emails=40,
            concurrency=2,
            repeats=1,
            port=port,
            store_urls={label: postgres_url},
            executions={label: "procrastinate"},
            workers={label: 2},
        )
    figures = result["variants"][label]
    _summary(figures["per_second"])
    assert figures["workers"] == 2


def test_reconciler() -> None:
    result = reconciler.run(small=400, large=800, pending=100, missing=10, repeats=1)
    for key in ("small_pass_seconds", "large_pass_seconds", "repair_pass_seconds"):
        _summary(result[key])
    _targets(result)


def test_stream() -> None:
    result = stream.run(clients=3, changes=15, seconds=0.5, repeats=1)
    assert result["deliveries"] == [45]
    for key in ("p50_s", "p95_s", "server_cpu_percent_of_one_core"):
        _summary(result[key])
    _targets(result)


def test_webhooks_lag_beside_the_send_benchmark_and_the_backlog() -> None:
    result = webhooks.run(
        rate=100, seconds=1, backlog_seconds=2, emails=30, concurrency=2, requests=50
    )
    for kind in ("lean", "threading"):
        receiver = result["receivers"][kind]
        assert receiver["per_second"] > 0 and receiver["logged_signed"] == 50
    for name in ("lag_alone", "lag_with_sends"):
        lag = result[name]
        assert lag["events"] > 0 and lag["delivered"] == lag["events"] and lag["lost"] == 0
        assert lag["in_order"] and lag["badly_signed"] == 0 and lag["caught_up"]
        assert 0 <= lag["lag_p50_s"] <= lag["lag_p99_s"] <= lag["lag_max_s"]
    loaded = result["lag_with_sends"]
    assert loaded["by_type"]["email.sent"] == 30  # the sends' own events are in the window
    assert loaded["by_type"]["email.cancelled"] == loaded["cancelled"]
    assert result["sends_alone"]["per_second"] > 0 and result["sends_ratio"] > 0
    beside = result["sends_beside_events"]  # the same writes, no endpoint: nothing delivered
    assert beside["sends"]["per_second"] > 0 and beside["by_type"]["email.sent"] == 30
    assert "delivered" not in beside and result["sends_beside_events_ratio"] > 0
    backlog = result["backlog"]
    assert backlog["events"] == 200 and backlog["delivered"] == 200 and backlog["in_order"]
    assert backlog["attempts_logged"] == backlog["requests"] and backlog["attempts_failed"] == 0
    assert [t["unit"] for t in result["targets"]] == ["s", "x"]
    _targets(result)
    table = render_markdown(
        {"machine": _MACHINE, "benchmarks": {"webhooks": result}, "targets": result["targets"]}
    )
    assert "| 15 webhooks: backlog of 200 events (2 s made at 100/s) drained, events/s |" in table
    assert "| 15 webhooks at 100 events/s, lag p50 / p99 s: while the send benchmark runs" in table


def test_suppression_import() -> None:
    result = suppressions.run((100, 300))
    assert set(result["modes"]) == set(suppressions.MODES)
    for figures in result["modes"].values():
        assert set(figures["runs"]) == {"100", "300"}
        assert all(run["peak_rss_mb"] > 0 for run in figures["runs"].values())
        assert math.isfinite(figures["peak_mb_at_1m"]) and figures["seconds_at_1m"] > 0
    assert [t["limit"] for t in result["targets"]] == [150.0, 150.0]
    _targets(result)
    table = render_markdown(
        {"machine": _MACHINE, "benchmarks": {"suppressions": result}, "targets": result["targets"]}
    )
    assert "| 13 suppression import (api): peak RSS MB at 100 / 300 rows -> 1M scaled" in table
    assert (
        "| suppression import peak RSS per 1M rows (cli, scaled from 100 and 300 rows) |" in table
    )


def test_stream_idle() -> None:
    result = stream.run_idle(campaigns=3, seconds=0.5, repeats=1)
    assert result["campaigns"] == 3
    for key in ("server_cpu_s", "server_cpu_percent_of_one_core"):
        _summary(result[key])


@pytest.mark.postgres
def test_changelog() -> None:
    result = changelog.run(database=postgres_database, writers=3, per_writer=10, repeats=1)
    for key in ("before_tx_per_second", "after_tx_per_second"):
        _summary(result[key])
    assert result["transactions"] == 60
    assert (result["reader_gaps"], result["reader_repeats"], result["reader_in_order"]) == (
        0,
        0,
        True,
    )
    _targets(result)
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"changelog": result}})
    assert "| 8 change-log writes, 3 writer threads, PostgreSQL: tx/s |" in rows


@pytest.mark.postgres
@pytest.mark.parametrize("locked", [True, False])
def test_changelog_pgbench_writers_run_the_flip_with_and_without_the_old_lock(
    locked: bool,
) -> None:
    """pgbench runs the script (a failed statement aborts its clients: SystemExit here)."""
    rate = changelog_pgbench.run_once(locked=locked, clients=2, seconds=1, tasks=50)
    assert rate > 0


@pytest.mark.postgres
def test_changelog_anchor_queues_every_write_on_the_old_global_lock() -> None:
    """The "before" statement (a literal of the pre-issue-16 store) still works on today's
    schema, and a transition waits while another transaction holds the old lock."""
    import threading

    import psycopg

    from sendqueue.adapters.procrastinate.schema import conninfo_from_url
    from sendqueue.adapters.sql import PostgresTaskStore
    from sendqueue.domain.lifecycle import TaskState as S
    from sendqueue.domain.models import task_id

    with postgres_database() as url:
        changelog.prepare(url, 1)
        store = PostgresTaskStore(url, upgrade=False, pg_idle_connections=1)
        changelog.use_locked_statement(store)
        moved: list[object] = []
        with psycopg.connect(conninfo_from_url(url)) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (changelog.OLD_LOCK_KEY,))
            claim = threading.Thread(
                target=lambda: moved.append(
                    store.transition(
                        task_id("bench", 0), S.PENDING, S.RUNNING, at=datetime.now(UTC)
                    )
                )
            )
            claim.start()
            waiting = 0
            for _ in range(200):
                waiting = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()[0]  # type: ignore[index]
                if waiting or not claim.is_alive():
                    break
                claim.join(0.05)
            assert waiting == 1 and moved == [], "the transition did not wait for the lock"
        claim.join(10)  # the holder's transaction ended with its connection
        store.close()
    [task] = moved
    assert task is not None and task.state is S.RUNNING  # type: ignore[attr-defined]


def _dovecot() -> None:
    """Skip locally, fail in CI, without Dovecot (the runner records the row as skipped)."""
    from tests.conftest import missing
    from tests.support.mailservers import dovecot_missing

    reason = dovecot_missing()
    if reason:
        missing(reason)


def test_feedback_poll_memory() -> None:
    _dovecot()
    result = feedback.run_memory(messages=4, size=64 * 1024)
    for key in ("growth_mb", "hold_batch_growth_mb", "poll_s", "parser_process_peak_rss_mb"):
        _summary(result[key])
    _targets(result)
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"feedback_memory": result}})
    assert "| 11 feedback poll of 4 x 64 KiB (Dovecot): peak RSS growth MB |" in rows


def test_feedback_api_during_a_hostile_poll() -> None:
    _dovecot()
    result = feedback.run_api(
        hostile=1,
        hostile_size=16 * 1024,
        tasks=5,
        campaigns=1,
        before_seconds=0.5,
        during_seconds=20,
    )
    for parser in feedback.VARIANTS:
        figures = result["variants"][parser]
        _summary(figures["before_ms"])
        _summary(figures["during_ms"])
        # a small hostile message: the reply behind it is applied either way, and seen
        assert figures["reply_applied_s"][0] is not None, parser
    _targets(result)
    rows = render_markdown({"machine": _MACHINE, "benchmarks": {"feedback_api": result}})
    assert "| 12 GET /api/campaigns during a poll of 1 hostile 16 KiB messages: " in rows


def test_feedback_rows_say_why_they_were_skipped() -> None:
    skipped = {"skipped": "no dovecot"}
    benchmarks = {"feedback_memory": skipped, "feedback_api": skipped}
    rows = render_markdown({"machine": _MACHINE, "benchmarks": benchmarks})
    assert "| 11 feedback poll memory | skipped: no dovecot |" in rows
    assert "| 12 API during a hostile feedback poll | skipped: no dovecot |" in rows


def test_the_runner_writes_both_result_files(tmp_path: Path) -> None:
    code = bench_main.main(
        [
            "--only",
            "planner",
            "reconciler",
            "--repeats",
            "1",
            "--planner-sends",
            "500",
            "--reconcile-small",
            "200",
            "--reconcile-large",
            "300",
            "--reconcile-pending",
            "50",
            "--reconcile-missing",
            "5",
            "--no-postgres",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"cpu_count", "cpu_model", "python", "sqlite", "load_average_at_start"} <= set(
        results["machine"]
    )
    assert set(results["benchmarks"]) == {"planner", "reconciler"}
    assert results["postgres"] == {"skipped": "disabled with --no-postgres"}
    assert results["procrastinate"] == {"skipped": "disabled with --no-postgres"}
    assert len(results["targets"]) == 2
    markdown = (tmp_path / "results.md").read_text()
    assert markdown == render_markdown(results)
    assert "| planner within 5x the naive baseline |" in markdown
