"""results.json -> the readable table of bench/results.md (and the printed summary)."""

from __future__ import annotations

from typing import Any

__all__ = ["render_markdown", "summary_rows"]


def _m(fig: dict[str, Any] | None, scale: float = 1.0, digits: int = 0) -> str:
    """``median (min-max)`` of a summary, scaled."""
    if not fig:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    med, lo, hi = (fmt.format(fig[k] * scale) for k in ("median", "min", "max"))
    return f"{med} ({lo}-{hi})"


def _rows(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, sendqueue, baseline or anchor, ratio) rows."""
    b = results["benchmarks"]
    rows: list[tuple[str, str, str, str]] = []
    if "planner" in b:
        p = b["planner"]
        rows.append(
            (
                f"1 planner, {p['sends']:,} sends: ns/send",
                _m(p["sendqueue_ns_per_send"]),
                f"naive aware datetimes: {_m(p['baseline_ns_per_send'])}",
                f"{p['ratio']:.2f}x",
            )
        )
    if "capacity" in b:
        c = b["capacity"]
        rows.append(
            (
                f"10 capacity planner, {c['sends']:,} sends, {c['senders']} senders, "
                f"{c['bookings']:,} bookings: µs/send",
                _m(c["sendqueue_us_per_send"], digits=3),
                f"plan() of as many: {_m(c['plan_us_per_send'], digits=3)}",
                f"{c['ratio']:.2f}x",
            )
        )
    provisioning = (
        ("provisioning", "2"),
        ("provisioning_postgresql", "7"),
        ("provisioning_procrastinate", "7"),
    )
    for key, label in provisioning:
        if key in b:
            p = b[key]
            where = f"{p['store']} store"
            if p.get("execution") == "procrastinate":
                where += ", procrastinate execution"
            rows.append(
                (
                    f"{label} provisioning {p['recipients']:,} ({where}): rows/s",
                    _m(p["sendqueue_per_second"]),
                    f"raw executemany: {_m(p['raw_per_second'])}",
                    f"{p['ratio']:.2f}x",
                )
            )
            if "one_at_a_time_per_second" in p:
                small = f"{label} provisioning {p['small']:,} ({where}"
                raw_small = f"raw executemany: {_m(p['raw_small_per_second'])}"
                rows.append(
                    (
                        f"{small}, create_many): rows/s",
                        _m(p["small_per_second"]),
                        raw_small,
                        f"{p['small_ratio']:.2f}x",
                    )
                )
                rows.append(
                    (
                        f"{small}, one create at a time, as before create_many): rows/s",
                        _m(p["one_at_a_time_per_second"]),
                        raw_small,
                        f"{p['one_at_a_time_ratio']:.2f}x",
                    )
                )
            if p["store"] == "SQLite":
                rows.append(
                    (
                        f"2 provisioning peak RSS, {p['small']:,} -> {p['recipients']:,}: MB",
                        f"{_m(p['peak_rss_mb_small'])} -> {_m(p['peak_rss_mb_large'])}",
                        "-",
                        f"+{p['rss_growth_mb']:.1f} MB",
                    )
                )
    if "dispatch" in b:
        d = b["dispatch"]
        v = d["variants"]
        title = f"3 dispatch, {d['schedules']:,} over {d['spread_s']:g} s"
        for name, fig in v.items():
            anchor = "EventBridge 60,000 ms; procrastinate poll 5,000 ms"
            if name.startswith("procrastinate"):
                # its own poll is 0.5 s here; the fleet target is p99 <= 1 s with 2 workers
                n = int(name.removeprefix("procrastinate").strip("-w") or 1)
                name = "procrastinate execution layer, PostgreSQL, " + (
                    "1 worker" if n == 1 else f"{n} worker processes"
                )
                anchor = "procrastinate default poll 5,000 ms; 0.5 s poll here"
            lateness = " / ".join(_m(fig.get(k)) for k in ("p50_ms", "p99_ms", "max_ms"))
            missing = fig.get("missing", {}).get("max", 0)
            if missing:
                # the percentiles cover only what fired: say how much did not
                lateness += f"; up to {missing:,.0f} not fired by the timeout"
            rows.append(
                (
                    f"{title}: p50 / p99 / max lateness ms ({name})",
                    lateness,
                    anchor,
                    "-",
                )
            )
            rows.append(
                (
                    f"3 dispatch, {d['burst']:,}-burst drain s ({name})",
                    _m(fig.get("burst_drain_s"), digits=2)
                    if "burst_drain_s" in fig or not missing
                    else "not drained by the timeout",
                    "-",
                    "-",
                )
            )
            if "sent_p99_ms" in fig:
                rows.append(
                    (
                        f"{title}: SMTP-accepted p50 / p99 lateness ms ({name})",
                        " / ".join(_m(fig.get(f"sent_{k}")) for k in ("p50_ms", "p99_ms")),
                        "-",
                        "-",
                    )
                )
    reason = results.get("procrastinate", {}).get("skipped")
    if reason and "dispatch" in b:
        rows.append(
            ("3 dispatch lateness (procrastinate execution layer)", f"skipped: {reason}", "-", "-")
        )
    if "throughput" in b:
        t = b["throughput"]
        for name, fig in t["variants"].items():
            rows.append(
                (
                    f"4/7 throughput, {t['emails']:,} emails, {t['concurrency']} threads: /s "
                    f"({name})",
                    _m(fig["per_second"]),
                    f"raw smtplib loop: {_m(t['raw_per_second'])}",
                    f"{fig['ratio']:.2f}x",
                )
            )
    if reason and "throughput" in b:
        rows.append(
            ("4 throughput (procrastinate execution layer)", f"skipped: {reason}", "-", "-")
        )
    if "queues" in b:
        rows += _queue_rows(b["queues"])
    pgq_reason = results.get("pgqueuer", {}).get("skipped")
    if pgq_reason and ("throughput" in b or "queues" in b):
        rows.append(
            ("4 pgqueuer prototype (the measured alternative)", f"skipped: {pgq_reason}", "-", "-")
        )
    if "fleet" in b:
        rows += _fleet_rows(b["fleet"])
    if reason and "fleet" in b:
        rows.append(("9 fleet (procrastinate execution layer)", f"skipped: {reason}", "-", "-"))
    if "reconciler" in b:
        r = b["reconciler"]
        rows.append(
            (
                f"5 reconciler pass, {r['pending']:,} Pending: s at {r['small_tasks']:,} / "
                f"{r['large_tasks']:,} tasks",
                f"{_m(r['small_pass_seconds'], digits=2)} / "
                f"{_m(r['large_pass_seconds'], digits=2)}",
                "-",
                f"{r['ratio']:.2f}x",
            )
        )
        rows.append(
            (
                f"5 reconciler pass repairing {r['missing']:,} schedules: s",
                _m(r["repair_pass_seconds"], digits=2),
                "-",
                "-",
            )
        )
    if "stream" in b:
        s = b["stream"]
        rows.append(
            (
                f"6 stream, {s['clients']} clients x {s['changes']:,} changes: p50 / p95 ms",
                f"{_m(s['p50_s'], 1000)} / {_m(s['p95_s'], 1000)}",
                "-",
                "-",
            )
        )
        rows.append(
            (
                "6 stream: server CPU, % of one core",
                _m(s["server_cpu_percent_of_one_core"], digits=1),
                "-",
                "-",
            )
        )
    rows += _feedback_rows(b)
    if "changelog" in b:
        c = b["changelog"]
        rows.append(
            (
                f"8 change-log writes, {c['writers']} writer threads, PostgreSQL: tx/s",
                _m(c["after_tx_per_second"]),
                f"old global advisory lock: {_m(c['before_tx_per_second'])}",
                f"{c['ratio']:.2f}x",
            )
        )
        rows.append(
            (
                "8 change log: tailing reader's gaps / repeats",
                f"{c['reader_gaps']} / {c['reader_repeats']}",
                "-",
                "-",
            )
        )
    if "suppressions" in b:
        rows += _suppression_rows(b["suppressions"])
    if "webhooks" in b:
        rows += _webhook_rows(b["webhooks"])
    rows += _sequence_rows(b)
    return rows


def _sequence_rows(b: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    if "sequences_throughput" in b:
        t = b["sequences_throughput"]
        for name, fig in t["variants"].items():
            rows.append(
                (
                    f"16 a {t['steps']}-step campaign's sends, {t['emails']:,} emails, each "
                    f"making the next step: /s ({name})",
                    _m(fig["sequence_per_second"]),
                    f"a one-step campaign's: {_m(fig['one_step_per_second'])}",
                    f"{fig['ratio']:.2f}x",
                )
            )
    if "sequences_provisioning" in b:
        p = b["sequences_provisioning"]
        rows.append(
            (
                f"16 provisioning a {p['steps']}-step sequence, {p['recipients']:,} recipients "
                f"({p['store']} store): rows/s",
                _m(p["sendqueue_per_second"]),
                f"raw executemany: {_m(p['raw_per_second'])}",
                f"{p['ratio']:.2f}x",
            )
        )
    return rows


def _webhook_rows(w: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Benchmark 15: the receivers alone, the sends and the lag with and without each other,
    the backlog's drain."""
    rec, alone, loaded = w["receivers"], w["lag_alone"], w["lag_with_sends"]
    sends, backlog = loaded["sends"], w["backlog"]
    rate = f"{loaded['rate']:,.0f} events/s"

    def lag(x: dict[str, Any]) -> str:
        return (
            f"{x['lag_p50_s']:.2f} / {x['lag_p99_s']:.2f} (made {x['made_per_s']:,.0f}/s, "
            f"{x['lost']} lost{'' if x['in_order'] else ', OUT OF ORDER'}; machine "
            f"{x['machine_busy_percent']:.0f}% busy)"
        )

    beside = w["sends_beside_events"]["sends"]["per_second"]
    return [
        (
            "15 webhook receivers alone, one request at a time on one connection: requests/s",
            f"{rec['lean']['server']}: {rec['lean']['per_second']:,.0f}",
            f"{rec['threading']['server']}: {rec['threading']['per_second']:,.0f}",
            "-",
        ),
        (
            f"15 send throughput ({sends['emails']:,} emails, SQLite), emails/s: while "
            f"delivering {rate} / beside the same event writes, no endpoint / alone",
            f"{sends['per_second']:,.0f}",
            f"beside the writes: {beside:,.0f}; alone: {w['sends_alone']['per_second']:,.0f}",
            f"{w['sends_ratio']:.2f}x ({w['sends_beside_events_ratio']:.2f}x)",
        ),
        (
            f"15 webhooks at {rate}, lag p50 / p99 s: while the send benchmark runs / alone",
            lag(loaded),
            f"alone: {lag(alone)}",
            f"p99 {w['lag_p99_ratio']:.2f}x",
        ),
        (
            f"15 webhooks: backlog of {backlog['events']:,} events ({backlog['seconds']:,} s made "
            f"at {backlog['rate']:,}/s) drained, events/s",
            f"{backlog['drain_per_s']:,.0f} ({backlog['lost']} lost"
            f"{'' if backlog['in_order'] else ', OUT OF ORDER'}; machine "
            f"{backlog['machine_busy_percent']:.0f}% busy)",
            f"made at {backlog['rate']:,}/s",
            f"{backlog['ratio']:.2f}x",
        ),
    ]


def _suppression_rows(s: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The suppression import: peak RSS at the two sizes and scaled to 1M rows, per mode."""
    small, large = s["sizes"]
    rows = []
    for mode, f in s["modes"].items():
        runs = f["runs"]
        rows.append(
            (
                f"13 suppression import ({mode}): peak RSS MB at {small:,} / {large:,} rows "
                "-> 1M scaled; s at 1M",
                f"{runs[str(small)]['peak_rss_mb']:.0f} / {runs[str(large)]['peak_rss_mb']:.0f} "
                f"-> {f['peak_mb_at_1m']:.0f}; {f['seconds_at_1m']:.0f} s",
                f"target {s['target_mb_per_million']:g} MB at 1M",
                "-",
            )
        )
    return rows


def _feedback_rows(b: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Benchmarks 11 (the poll's memory) and 12 (the API during a hostile poll)."""
    rows: list[tuple[str, str, str, str]] = []
    m = b.get("feedback_memory")
    if m is not None and "skipped" in m:
        rows.append(("11 feedback poll memory", f"skipped: {m['skipped']}", "-", "-"))
    elif m is not None:
        growth, held = m["growth_mb"], m["hold_batch_growth_mb"]
        rows.append(
            (
                f"11 feedback poll of {m['messages']} x {m['size_bytes'] // 1024:,} KiB "
                "(Dovecot): peak RSS growth MB",
                _m(growth, digits=1),
                f"each batch held as a list (as before): {_m(held)}",
                f"{growth['median'] / held['median']:.2f}x",
            )
        )
        rows.append(
            (
                "11 the feedback parser's own process: peak RSS MB",
                _m(m["parser_process_peak_rss_mb"]),
                "-",
                "-",
            )
        )
    a = b.get("feedback_api")
    if a is not None and "skipped" in a:
        rows.append(("12 API during a hostile feedback poll", f"skipped: {a['skipped']}", "-", "-"))
    elif a is not None:
        v = a["variants"]
        title = (
            f"12 GET /api/campaigns during a poll of {a['hostile']} hostile "
            f"{a['hostile_size_bytes'] // 1024:,} KiB messages: median ms before / during"
        )

        def pair(fig: dict[str, Any]) -> str:
            return f"{_m(fig['before_ms'], digits=1)} / {_m(fig['during_ms'], digits=1)}"

        def applied(fig: dict[str, Any]) -> str:
            done = [f"{s:.1f} s" for s in fig["reply_applied_s"] if s is not None]
            return ", ".join(done) or f"not within {a['during_seconds']:g} s"

        rows.append(
            (
                f"{title} (isolated parser)",
                pair(v["isolated"]),
                f"parser in the server's process: {pair(v['in-process'])}",
                f"{v['isolated']['ratio']:.2f}x (in-process {v['in-process']['ratio']:.2f}x)",
            )
        )
        rows.append(
            (
                "12 the genuine reply behind them applied after (isolated; in-process)",
                applied(v["isolated"]),
                applied(v["in-process"]),
                "-",
            )
        )
    if "feedback_parse" in b:
        rows += _feedback_parse_rows(b["feedback_parse"])
    return rows


def _feedback_parse_rows(f: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Benchmark 14: a row per hostile shape, against the ordinary message of the same size."""
    shapes = dict(f["shapes"])
    control = shapes.pop("control")
    size = "1 MiB" if f["size"] == 1 << 20 else f"{f['size']:,} B"
    anchor = f"ordinary message of the same size: {_m(control['seconds'], digits=3)}"
    return [
        (
            f"14 feedback parse, hostile {size} message: s ({name})",
            _m(fig["seconds"], digits=3),
            anchor,
            f"{fig['vs_control']:.1f}x",
        )
        for name, fig in shapes.items()
    ]


_QUEUE_NAMES = {
    "fire-loop": "procrastinate layer's fire loop",
    "pgqueuer": "pgqueuer, asyncpg, job on a thread",
    "pgqueuer-async": "pgqueuer, asyncpg, async job",
    "pgqueuer-psycopg": "pgqueuer, psycopg driver, job on a thread",
}


def _queue_rows(q: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The queues alone: no-op jobs/s and client CPU per job, against the fire
    loop."""
    fire = q["queues"]["fire-loop"]["per_second"]
    rows = []
    for name, fig in q["queues"].items():
        rows.append(
            (
                f"4q queue alone, {q['jobs']:,} no-op jobs, {q['concurrency']} threads: "
                f"jobs/s; client CPU ms/job ({_QUEUE_NAMES.get(name, name)})",
                f"{_m(fig['per_second'])}; {_m(fig['cpu_ms_per_job'], digits=2)}",
                f"fire loop: {_m(fire)}",
                f"{fig['per_second']['median'] / fire['median']:.2f}x",
            )
        )
    return rows


def _fleet_rows(f: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Benchmark 9: a row per fleet measurement, and where its CPU went."""
    raw = " / ".join(f"{v:,.0f}" for v in f["raw_per_second"])
    rows: list[tuple[str, str, str, str]] = []
    held = f.get("waiting_set")
    if held:
        rows.append(
            (
                f"9 fleet waiting set: {held['tasks']:,} tasks due 2 h later, jobs waiting",
                f"{held['jobs_waiting']:,} (created in {held['create_s']:.0f} s)",
                "-",
                "-",
            )
        )
    for r in f["rows"]:
        plural = "es" if r["workers"] > 1 else ""
        who = f"{r['layer']}, {r['workers']} process{plural}"
        if r["waiting"]:
            who += f", {r['waiting']:,} waiting"
        if r["kind"] == "throughput":
            ratio = f"{r['vs_raw']:.2f}x raw"
            if r["layer"] == "procrastinate" and "vs_one_process" in r:
                ratio += f", {r['vs_one_process']:.2f}x 1 process"
            rows.append(
                (
                    f"9 fleet throughput, {f['emails']:,} due emails: /s ({who})",
                    f"{r['per_second']:,.0f}",
                    f"raw smtplib loop (start / end): {raw}",
                    ratio,
                )
            )
        else:
            title = f"9 fleet dispatch, {f['rate']:g} due/s over {f['spread_s']:g} s"
            rows.append(
                (
                    f"{title}: claim p50 / p99 / max lateness ms ({who})",
                    " / ".join(f"{r[k]:,.0f}" for k in ("p50_ms", "p99_ms", "max_ms")),
                    "-",
                    "-",
                )
            )
            if "burst_drain_s" in r:
                rows.append(
                    (f"9 fleet, {f['burst']:,}-burst drain s ({who})",
                     f"{r['burst_drain_s']:.2f}", "-", "-")
                )  # fmt: skip
        rows.append((f"9 fleet {r['kind']}: CPU use ({who})", _usage(r["usage"]), "-", "-"))
    return rows


def _usage(u: dict[str, Any]) -> str:
    """Where a fleet row's CPU went: each worker, the database's backends, the whole machine."""
    workers = " + ".join(f"{v:.0f}%" for v in u["worker_cpu_percent_of_one_core"].values())
    text = f"workers {workers} of a core"
    if "postgres_cpu_s" in u:
        text += f"; PostgreSQL backends {100 * u['postgres_cpu_s'] / u['wall_s']:.0f}%"
    text += f"; machine {u['machine_busy_percent']:.0f}% of {u['cores']} cores busy"
    if "connections_max" in u:
        text += "; connections per worker " + ", ".join(
            str(v) for v in u["connections_max"].values()
        )
    return text


def render_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# sendqueue benchmarks",
        "",
        f"{m['cpu_count']} CPUs ({m['cpu_model']}), Python {m['python']}, SQLite {m['sqlite']}, "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['load_average_at_start'])}"
        + (
            f", at end {', '.join(f'{x:.2f}' for x in m['load_average_at_end'])}"
            if "load_average_at_end" in m
            else ""
        )
        + f"; commit {m.get('git_commit', '?')}; {results.get('seconds', 0):.0f} s in all.",
        "",
        "Figures are median (min-max) over the repeats; ratios are of medians from this run.",
        "",
        "| figure | sendqueue | baseline / anchor | ratio |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(results)]
    lines += ["", "| target | value | limit | result |", "|---|---|---|---|"]
    for t in results.get("targets", []):
        lines.append(
            f"| {t['name']} | {t['value']:,.2f} {t['unit']} | {t['limit']:g} {t['unit']} | "
            f"{'met' if t['passed'] else '**missed**'} |"
        )
    notes = []
    for what in ("postgres", "procrastinate"):
        reason = results.get(what, {}).get("skipped")
        if reason:
            notes.append(f"- {what}: skipped: {reason}")
    for name, error in results.get("errors", {}).items():
        notes.append(f"- {name}: failed: {error}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def summary_rows(results: dict[str, Any]) -> list[str]:
    targets = results.get("targets", [])
    met = sum(1 for t in targets if t["passed"])
    out = [f"[bench] targets met: {met} of {len(targets)}"]
    out += [f"[bench]   missed: {t['name']} ({t['value']:.2f} {t['unit']})"
            for t in targets if not t["passed"]]  # fmt: skip
    return out
