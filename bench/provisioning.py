"""Benchmark 2 (and 7 on PostgreSQL): provisioning a campaign end to end.

sendqueue: ``Provisioner.provision`` of an imported draft campaign, on the embedded default
(task store and execution layer in two SQLite files): plan, one task per recipient with its
change-log entry, one schedule per task, checkpoints, the lease. With ``--postgres`` the task
store is PostgreSQL (the execution layer stays embedded). The procrastinate variant puts the
schedules in PostgreSQL too, as procrastinate jobs (due within the horizon) and parked rows
(beyond it), written with ``create_many``; it also measures, at the small size, the same
provisioning with one ``create`` at a time on ``provision_concurrency`` threads (what it did
before ``create_many``).

Baseline: the physical limit, ``executemany`` of the equivalent rows (one task row per
recipient, one schedule row per task, the same tables and indexes) into the same two files,
one transaction each, with the rows built beforehand (not timed). For a campaign with senders
the equivalent rows include one slot row per task (``sender_bookings``), the one row a
booking must write; the report also gives the ratio to the baseline without them. On
PostgreSQL the task rows go through psycopg's ``executemany`` instead; with procrastinate the
schedule rows go through it as well, into ``procrastinate_jobs`` or
``sendqueue_parked_schedules`` (as the adapter splits them at its horizon), in the same
transaction as the task rows.

Every measurement runs in a fresh child process, from a copy of one imported campaign: its
``ru_maxrss`` is its own peak, which gives the memory growth from the small to the large size.
The two sides alternate.

Child entry points (used by the parent):
``python -m bench.provisioning sendqueue|raw ... [--execution procrastinate|procrastinate-one]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bench.common import child_usage, cpu_seconds, postgres_database, run_child, summarize

__all__ = ["RSS_GROWTH_LIMIT_MB", "SQLITE_TARGET", "TARGET", "run"]

#: sendqueue's provisioning rate must be at least this fraction of the raw insert rate
#: (PostgreSQL stores, either execution layer).
TARGET = 0.3
#: The same on the SQLite store (the embedded default).
SQLITE_TARGET = 0.5
#: Peak RSS may grow by less than this from the small to the large campaign.
RSS_GROWTH_LIMIT_MB = 50.0


# -- the template campaign ------------------------------------------------------------------------


#: The execution layers a child can provision with: procrastinate-one is procrastinate with
#: one create at a time (its scheduler behind a wrapper that is not a BulkScheduler).
EXECUTIONS = ("embedded", "procrastinate", "procrastinate-one")


def _settings(store_url: str, scheduler_url: str, execution: str = "embedded") -> Any:
    from sendqueue.settings import Settings

    if execution == "embedded":
        return Settings(_env_file=None, database_url=store_url, scheduler_url=scheduler_url)
    return Settings(_env_file=None, database_url=store_url, execution="procrastinate")


class _OneAtATime:
    """Forwards everything to a scheduler but is no BulkScheduler: the schedule writer then
    calls ``create`` once per schedule, ``provision_concurrency`` calls in flight."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


#: Senders of the with-senders variant, and each one's daily cap and minimum gap: room for
#: the campaign's 10,000 a day (the default 09:00-17:00 window holds 28,800 one-second slots).
SENDERS = 20
SENDER_CAP = 1_000
SENDER_GAP = 1


def import_campaign(store_url: str, scheduler_url: str, recipients: int, senders: int = 0) -> str:
    """A draft campaign of ``recipients`` (the demo CSV, Europe/Berlin, 10,000 a day), spread
    across ``senders`` new senders when given (each booking its slots as it is provisioned)."""
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.policy import SendingPolicy
    from sendqueue.services.campaigns.demo import demo_csv
    from sendqueue.services.importing.recipients import Templates

    app = bootstrap(_settings(store_url, scheduler_url))
    try:
        ids = [
            app.senders.add(
                email=f"sender{n}@example.com", daily_cap=SENDER_CAP, min_gap_seconds=SENDER_GAP
            ).id
            for n in range(senders)
        ]
        created = app.campaign_import.create(
            senders=ids,
            name=f"bench {recipients}",
            recipients=demo_csv(recipients),
            policy=SendingPolicy(timezone="Europe/Berlin", per_day=10_000),
            templates=Templates(subject="Hello {{ name }}", body="Dear {{ name }} in {{ city }}"),
        )
        return created.campaign.id
    finally:
        app.close()


def _copy_sqlite(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")


# -- children -------------------------------------------------------------------------------------


def child_sendqueue(
    store_url: str, scheduler_url: str, campaign_id: str, execution: str = "embedded"
) -> dict[str, Any]:
    from sendqueue.bootstrap import bootstrap, settle_heap

    app = bootstrap(_settings(store_url, scheduler_url, execution))
    settle_heap()  # as `sendqueue campaign provision` does once its container is built
    app.store.get_campaign(campaign_id)  # schema check and connections, before the clock starts
    _ = app.scheduler  # procrastinate: its schema installed here, untimed
    if execution == "procrastinate-one":
        app.__dict__["scheduler"] = _OneAtATime(app.scheduler)
    cpu = cpu_seconds()
    started = time.perf_counter()
    report = app.provisioner.provision(campaign_id)
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    app.close()
    if report.status != "done" or report.schedules_created != report.total:
        raise AssertionError(f"provisioning did not finish: {report}")
    return {
        "seconds": seconds,
        "tasks": report.tasks_created,
        "schedules": report.schedules_created,
        **child_usage(),
        "work_cpu_s": cpu,
    }


def _task_rows(recipients: list[tuple[Any, ...]], campaign_id: str) -> list[tuple[Any, ...]]:
    send = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    stamp = datetime.now(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
    rows = []
    for position, email, name, subject, text, html in recipients:
        at = (send + timedelta(seconds=position)).replace(tzinfo=None)
        rows.append(
            (
                f"{campaign_id}-{position}", campaign_id, position, email, name, subject, text,
                html, at.isoformat(" ", "microseconds"), "Pending", f"{position:032x}", 0, None,
                None, None, None, stamp, stamp,
            )
        )  # fmt: skip
    return rows


def _schedules(tasks: list[tuple[Any, ...]]) -> Iterator[tuple[str, int, str, dict[str, str]]]:
    """(name, position, client token, payload) of each task row's schedule, as the schedule
    writer makes them."""
    for task in tasks:
        task_id, position, token = task[0], task[2], task[10]
        yield (
            f"sq-{task_id}-0",
            position,
            token,
            {"kind": "send", "task_id": task_id, "token": token},
        )


def _schedule_rows(tasks: list[tuple[Any, ...]], campaign_id: str) -> list[tuple[Any, ...]]:
    """The embedded scheduler's rows of ``tasks``' schedules."""
    created = int(time.time() * 1_000_000)
    due = 1_767_600_000_000_000  # microseconds, one second apart
    return [
        (
            name, f"sq-{campaign_id}", "2026-01-05T09:00:00", "Europe/Berlin",
            json.dumps(payload, sort_keys=True), token, due + position * 1_000_000, 2, 0, created,
        )
        for name, position, token, payload in _schedules(tasks)
    ]  # fmt: skip


def _recipient_rows(conn: Any, campaign_id: str, mark: str) -> list[tuple[Any, ...]]:
    """The campaign's recipients as :func:`_task_rows` takes them (``mark``: the driver's
    parameter mark); the read is committed, so the timed transaction starts clean."""
    rows = conn.execute(
        "SELECT position, email, name, subject, text, html FROM recipients "
        f"WHERE campaign_id = {mark} ORDER BY position",
        (campaign_id,),
    ).fetchall()
    conn.commit()
    return list(rows)


_TASK_INSERT = (
    "INSERT INTO tasks (id, campaign_id, position, email, name, subject, text, html, send_at, "
    "state, token, attempts, claimed_at, sent_at, message_id, error, created_at, updated_at) "
    "VALUES ({marks})"
)
_SCHEDULE_INSERT = (
    "INSERT INTO schedules (name, grp, at_local, timezone, payload, client_token, due_at, "
    "max_retries, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


_BOOKING_INSERT = (
    "INSERT INTO sender_bookings (sender_id, at_ms, task_id, campaign_id, day, recipient, cap, "
    "sent) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _booking_rows(
    conn: Any, tasks: list[tuple[Any, ...]], campaign_id: str, mark: str
) -> list[tuple[Any, ...]]:
    """For a campaign with senders, the equivalent of what its provisioning books: one slot
    row per task, round-robin over its senders (a distinct instant each); none otherwise."""
    row = conn.execute(
        f"SELECT sender_ids FROM campaigns WHERE id = {mark}", (campaign_id,)
    ).fetchone()
    senders = json.loads(row[0]) if row and row[0] else []
    if not senders:
        return []
    day = datetime(2027, 1, 4, tzinfo=UTC).date()
    return [
        (senders[i % len(senders)], 1_800_000_000_000 + i * 1000, task[0], campaign_id, day,
         f"r{i}@example.com", SENDER_CAP, False)
        for i, task in enumerate(tasks)
    ]  # fmt: skip


def child_raw(store_url: str, scheduler_file: str, campaign_id: str) -> dict[str, Any]:
    """executemany of the equivalent rows, one transaction per file."""
    from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler

    EmbeddedScheduler(f"sqlite:///{scheduler_file}").close()  # its schema, not timed
    postgres = store_url.startswith("postgresql")
    if postgres:
        import psycopg

        conn: Any = psycopg.connect(store_url.replace("postgresql+psycopg", "postgresql", 1))
        mark = "%s"
    else:
        path = store_url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        mark = "?"
    recipients = _recipient_rows(conn, campaign_id, mark)
    marks = ", ".join([mark] * 18)
    tasks = _task_rows(recipients, campaign_id)
    schedules = _schedule_rows(tasks, campaign_id)
    bookings = _booking_rows(conn, tasks, campaign_id, mark)
    sched = sqlite3.connect(scheduler_file, isolation_level=None)
    sched.execute("PRAGMA journal_mode = WAL")
    sched.execute("PRAGMA synchronous = NORMAL")

    cpu = cpu_seconds()
    started = time.perf_counter()
    if postgres:
        with conn.cursor() as cur:
            cur.executemany(_TASK_INSERT.format(marks=marks), tasks)
            booking_started = time.perf_counter()
            if bookings:
                cur.executemany(_BOOKING_INSERT.replace("?", "%s"), bookings)
            booking_seconds = time.perf_counter() - booking_started
        conn.commit()
    else:
        conn.execute("BEGIN")
        conn.executemany(_TASK_INSERT.format(marks=marks), tasks)
        booking_started = time.perf_counter()
        if bookings:
            conn.executemany(_BOOKING_INSERT, bookings)
        booking_seconds = time.perf_counter() - booking_started
        conn.execute("COMMIT")
    middle = time.perf_counter()
    sched.execute("BEGIN")
    sched.executemany(_SCHEDULE_INSERT, schedules)
    sched.execute("COMMIT")
    ended = time.perf_counter()
    cpu = cpu_seconds() - cpu
    conn.close()
    sched.close()
    return {
        "seconds": ended - started,
        "tasks_seconds": middle - started,
        "schedules_seconds": ended - middle,
        "tasks": len(tasks),
        "schedules": len(schedules),
        "bookings": len(bookings),
        "bookings_seconds": booking_seconds,
        **child_usage(),
        "work_cpu_s": cpu,
    }


_JOB_INSERT = (
    "INSERT INTO procrastinate_jobs (queue_name, task_name, priority, queueing_lock, args, "
    "scheduled_at) VALUES (%s, %s, %s, %s, %s, %s)"
)
_PARKED_INSERT = (
    "INSERT INTO sendqueue_parked_schedules (name, grp, due_at, args) VALUES (%s, %s, %s, %s)"
)


def child_raw_procrastinate(store_url: str, campaign_id: str) -> dict[str, Any]:
    """executemany of the task rows and of the schedules' rows (a job within the horizon, a
    parked row beyond it, with the adapter's arguments), one transaction, one connection."""
    import psycopg
    from psycopg.types.json import Jsonb

    from sendqueue.adapters.procrastinate.jobs import FIRE_TASK, priority
    from sendqueue.adapters.procrastinate.schema import upgrade_schema
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.models import schedule_group
    from sendqueue.domain.planner import plan

    upgrade_schema(store_url)  # procrastinate's schema, not timed
    app = bootstrap(_settings(store_url, "", "procrastinate"))
    campaign = app.store.get_campaign(campaign_id)
    app.close()
    now = datetime.now(UTC)
    sends = plan(campaign.policy, campaign.recipient_count, now=now)
    horizon = now + timedelta(seconds=300)  # the adapter's default
    zone = ZoneInfo(campaign.policy.timezone)
    conn: Any = psycopg.connect(store_url.replace("postgresql+psycopg", "postgresql", 1))
    tasks = _task_rows(_recipient_rows(conn, campaign_id, "%s"), campaign_id)
    group = schedule_group(campaign_id)
    jobs: list[tuple[Any, ...]] = []
    parked: list[tuple[Any, ...]] = []
    stamp = now.isoformat()
    for name, position, token, payload in _schedules(tasks):
        due = sends[position]
        args = {
            "name": name, "group": group,
            "at_local": due.astimezone(zone).replace(tzinfo=None).isoformat(),
            "timezone": campaign.policy.timezone, "payload": payload,
            "client_token": token, "max_retries": 2, "created_at": stamp,
        }  # fmt: skip
        if due <= horizon:
            jobs.append((group, FIRE_TASK, priority(due), name, Jsonb(args), due))
        else:
            parked.append((name, group, due, Jsonb(args)))

    cpu = cpu_seconds()
    started = time.perf_counter()
    with conn.cursor() as cur:
        cur.executemany(_TASK_INSERT.format(marks=", ".join(["%s"] * 18)), tasks)
        middle = time.perf_counter()
        cur.executemany(_JOB_INSERT, jobs)
        cur.executemany(_PARKED_INSERT, parked)
    conn.commit()
    ended = time.perf_counter()
    cpu = cpu_seconds() - cpu
    conn.close()
    return {
        "seconds": ended - started,
        "tasks_seconds": middle - started,
        "schedules_seconds": ended - middle,
        "tasks": len(tasks),
        "schedules": len(jobs) + len(parked),
        "jobs": len(jobs),
        **child_usage(),
        "work_cpu_s": cpu,
    }


# -- the parent -----------------------------------------------------------------------------------


class _Templates:
    """One imported campaign per size, copied (SQLite) or cloned (PostgreSQL) per measurement."""

    def __init__(self, stack: ExitStack, home: Path, postgres: bool, senders: int = 0) -> None:
        self._senders = senders
        self._stack = stack
        self._home = home
        self._postgres = postgres
        self._made: dict[int, tuple[str, str]] = {}  # size -> (store url or file, campaign)
        self._n = 0

    def template(self, size: int) -> tuple[str, str]:
        if size not in self._made:
            if self._postgres:
                url = self._stack.enter_context(postgres_database())
            else:
                url = f"sqlite:///{self._home / f'template-{size}.db'}"
            cid = import_campaign(
                url, f"sqlite:///{self._home / 'unused-scheduler.db'}", size, self._senders
            )
            self._made[size] = (url, cid)
        return self._made[size]

    def fresh(self, size: int) -> tuple[str, str, str]:
        """(store url, scheduler file, campaign id) of a new copy of the size's template."""
        url, cid = self.template(size)
        self._n += 1
        scheduler = str(self._home / f"scheduler-{self._n}.db")
        if self._postgres:
            import psycopg

            from bench.common import POSTGRES_ADMIN_URL

            name = f"{url.rsplit('/', 1)[1]}_c{self._n}"
            with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{url.rsplit("/", 1)[1]}"')
            self._stack.callback(_drop_database, name)
            return url.rsplit("/", 1)[0] + "/" + name, scheduler, cid
        copy = self._home / f"store-{self._n}.db"
        _copy_sqlite(Path(url.removeprefix("sqlite:///")), copy)
        return f"sqlite:///{copy}", scheduler, cid


def _drop_database(name: str) -> None:
    import psycopg

    from bench.common import POSTGRES_ADMIN_URL

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(
    *,
    recipients: int,
    small: int,
    repeats: int,
    postgres: bool = False,
    execution: str = "embedded",
    senders: int = 0,
) -> dict[str, Any]:
    """The provisioning benchmark on one store and execution layer (procrastinate: PostgreSQL
    for both, and the one-create-at-a-time run at the small size, beside its own raw run).
    With ``senders``, the campaign is spread across that many senders and books a slot per
    email (the raw side inserts the same task and schedule rows, no bookings)."""
    procrastinate = execution == "procrastinate"
    postgres = postgres or procrastinate
    sq: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    small_runs: list[dict[str, Any]] = []
    one_runs: list[dict[str, Any]] = []
    raw_small: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sq-bench-prov-") as tmp, ExitStack() as stack:
        templates = _Templates(stack, Path(tmp), postgres, senders)
        templates.template(recipients)
        templates.template(small)

        def run_sendqueue(size: int, into: list[dict[str, Any]], how: str = execution) -> None:
            url, scheduler, cid = templates.fresh(size)
            into.append(
                run_child(
                    "bench.provisioning",
                    "sendqueue",
                    url,
                    f"sqlite:///{scheduler}",
                    cid,
                    "--execution",
                    how,
                )
            )

        def run_raw(size: int, into: list[dict[str, Any]]) -> None:
            url, scheduler, cid = templates.fresh(size)
            into.append(
                run_child(
                    "bench.provisioning", "raw", url, scheduler, cid, "--execution", execution
                )
            )

        for n in range(repeats):
            steps: list[Callable[[], None]] = [
                lambda: run_sendqueue(recipients, sq),
                lambda: run_raw(recipients, raw),
                lambda: run_sendqueue(small, small_runs),
            ]
            if procrastinate:
                steps += [
                    lambda: run_sendqueue(small, one_runs, "procrastinate-one"),
                    lambda: run_raw(small, raw_small),
                ]
            for step in steps if n % 2 == 0 else [steps[1], steps[0], *steps[2:]]:
                step()
    sq_rate = summarize([recipients / r["seconds"] for r in sq])
    raw_rate = summarize([recipients / r["seconds"] for r in raw])
    ratio = sq_rate.median / raw_rate.median
    # With senders: the same, against the raw rows without the slot rows (for the report).
    plain_raw = summarize(
        [recipients / (r["seconds"] - r.get("bookings_seconds", 0.0)) for r in raw]
    )
    peak_large = summarize([r["peak_rss_mb"] for r in sq])
    peak_small = summarize([r["peak_rss_mb"] for r in small_runs])
    growth = peak_large.median - peak_small.median
    store = "PostgreSQL" if postgres else "SQLite"
    where = f"{store} store" + (", procrastinate execution" if procrastinate else "")
    if senders:
        where += f", {senders} senders booking every send"
    target = TARGET if postgres else SQLITE_TARGET
    targets = [
        {
            "name": f"provisioning at >= {target:g}x raw inserts ({where})",
            "value": ratio,
            "limit": target,
            "unit": "x",
            "passed": ratio >= target,
        }
    ]
    if not postgres:
        targets.append(
            {
                "name": f"peak RSS grows < 50 MB from {small:,} to {recipients:,} recipients",
                "value": growth,
                "limit": RSS_GROWTH_LIMIT_MB,
                "unit": "MB",
                "passed": growth < RSS_GROWTH_LIMIT_MB,
            }
        )
    result = {
        "store": store,
        "execution": execution,
        "senders": senders,
        "recipients": recipients,
        "small": small,
        "repeats": repeats,
        "sendqueue_seconds": summarize([r["seconds"] for r in sq]).as_dict(),
        "sendqueue_per_second": sq_rate.as_dict(),
        "sendqueue_cpu_seconds": summarize([r["work_cpu_s"] for r in sq]).as_dict(),
        "raw_cpu_seconds": summarize([r["work_cpu_s"] for r in raw]).as_dict(),
        "raw_seconds": summarize([r["seconds"] for r in raw]).as_dict(),
        "raw_per_second": raw_rate.as_dict(),
        "raw_tasks_seconds": summarize([r["tasks_seconds"] for r in raw]).as_dict(),
        "raw_schedules_seconds": summarize([r["schedules_seconds"] for r in raw]).as_dict(),
        "ratio": ratio,
        "ratio_without_booking_rows": sq_rate.median / plain_raw.median,
        "small_seconds": summarize([r["seconds"] for r in small_runs]).as_dict(),
        "peak_rss_mb_large": peak_large.as_dict(),
        "peak_rss_mb_small": peak_small.as_dict(),
        "rss_growth_mb": growth,
        "targets": targets,
    }
    if procrastinate:
        # At the small size, side by side: bulk, one create at a time, raw.
        bulk_small = summarize([small / r["seconds"] for r in small_runs])
        one_rate = summarize([small / r["seconds"] for r in one_runs])
        raw_small_rate = summarize([small / r["seconds"] for r in raw_small])
        result.update(
            small_per_second=bulk_small.as_dict(),
            one_at_a_time_per_second=one_rate.as_dict(),
            raw_small_per_second=raw_small_rate.as_dict(),
            small_ratio=bulk_small.median / raw_small_rate.median,
            one_at_a_time_ratio=one_rate.median / raw_small_rate.median,
            raw_jobs=raw[0]["jobs"],
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.provisioning")
    parser.add_argument("side", choices=["sendqueue", "raw"])
    parser.add_argument("store_url")
    parser.add_argument("scheduler")
    parser.add_argument("campaign_id")
    parser.add_argument("--execution", choices=EXECUTIONS, default="embedded")
    args = parser.parse_args()
    if args.side == "sendqueue":
        result = child_sendqueue(args.store_url, args.scheduler, args.campaign_id, args.execution)
    elif args.execution == "embedded":
        result = child_raw(args.store_url, args.scheduler, args.campaign_id)
    else:
        result = child_raw_procrastinate(args.store_url, args.campaign_id)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
