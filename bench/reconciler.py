"""Benchmark 5: one reconciler pass over a large store.

One active campaign holds ``total`` tasks, of which ``pending`` are Pending (each with its
schedule in the execution layer) and the rest final (Finished, a few Failed and Cancelled):
a large campaign near its end. The stores are written with bulk SQL straight into the files
(the same rows the services would write), then one pass runs through ``Reconciler.run``:

- with nothing to repair, at the small and at the large total: the pass must scale with the
  Pending tasks, not the total, so the large pass must take at most twice the small one;
- after deleting ``missing`` schedules: the pass that recreates them.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import summarize

__all__ = ["TARGET", "run"]

#: The large pass may take at most this many times the small one.
TARGET = 2.0

_CID = "bench"
_TASK_COLUMNS = (
    "id, campaign_id, position, email, name, subject, text, html, send_at, state, token, "
    "attempts, claimed_at, sent_at, message_id, error, created_at, updated_at"
)


def _text(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def build(home: Path, total: int, pending: int) -> tuple[str, str]:
    """The two SQLite files; returns (store URL, scheduler URL)."""
    from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
    from sendqueue.adapters.sql import open_store
    from sendqueue.domain.lifecycle import CampaignState
    from sendqueue.domain.models import Campaign, schedule_name
    from sendqueue.domain.policy import SendingPolicy, Window

    store_url = f"sqlite:///{home / 'store.db'}"
    scheduler_url = f"sqlite:///{home / 'scheduler.db'}"
    now = datetime.now(UTC)
    with open_store(store_url) as store:
        policy = SendingPolicy(
            timezone="UTC",
            per_day=10_000,
            weekdays=frozenset(range(7)),
            windows=(Window(0, 1440),),
        )
        store.create_campaign(
            Campaign(
                id=_CID,
                name="large",
                policy=policy,
                from_addr="bench@example.com",
                created_at=now,
                updated_at=now,
                checkpoint={"phase": "done", "plan_start": now.isoformat()},
            ),
            [],
        )
        for old, new in (
            (CampaignState.DRAFT, CampaignState.PROVISIONING),
            (CampaignState.PROVISIONING, CampaignState.ACTIVE),
        ):
            store.set_campaign_state(_CID, {old}, new, at=now)
    EmbeddedScheduler(scheduler_url).close()

    stamp = _text(now)
    future = now + timedelta(days=30)
    final = total - pending
    conn = sqlite3.connect(home / "store.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN")
    marks = ", ".join("?" * 18)
    batch: list[tuple[Any, ...]] = []
    schedules: list[tuple[Any, ...]] = []
    for position in range(total):
        tid = f"{_CID}-{position}"
        token = f"{position:032x}"
        if position < final:
            state = "Finished" if position % 50 else ("Failed" if position % 100 else "Cancelled")
            send_at = now - timedelta(seconds=total - position)
            row: tuple[Any, ...] = (
                tid,
                _CID,
                position,
                f"r{position}@example.com",
                f"R {position}",
                "Hello",
                "A message.",
                None,
                _text(send_at),
                state,
                token,
                1,
                stamp,
                stamp if state == "Finished" else None,
                f"<{tid}@example.com>",
                None,
                stamp,
                stamp,
            )
        else:
            send_at = future + timedelta(seconds=position)
            row = (
                tid,
                _CID,
                position,
                f"r{position}@example.com",
                f"R {position}",
                "Hello",
                "A message.",
                None,
                _text(send_at),
                "Pending",
                token,
                0,
                None,
                None,
                None,
                None,
                stamp,
                stamp,
            )
            payload = json.dumps({"kind": "send", "task_id": tid, "token": token}, sort_keys=True)
            schedules.append(
                (
                    schedule_name(tid, 0),
                    f"sq-{_CID}",
                    send_at.replace(tzinfo=None).isoformat(),
                    "UTC",
                    payload,
                    token,
                    int(send_at.timestamp() * 1_000_000),
                    2,
                    0,
                    int(now.timestamp() * 1e6),
                )
            )
        batch.append(row)
        if len(batch) == 50_000:
            conn.executemany(f"INSERT INTO tasks ({_TASK_COLUMNS}) VALUES ({marks})", batch)
            batch.clear()
    if batch:
        conn.executemany(f"INSERT INTO tasks ({_TASK_COLUMNS}) VALUES ({marks})", batch)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    sched = sqlite3.connect(home / "scheduler.db", isolation_level=None)
    sched.execute("BEGIN")
    sched.executemany(
        "INSERT INTO schedules (name, grp, at_local, timezone, payload, client_token, due_at, "
        "max_retries, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        schedules,
    )
    sched.execute("COMMIT")
    sched.close()
    return store_url, scheduler_url


def _pass(store_url: str, scheduler_url: str) -> tuple[float, Any]:
    from sendqueue.bootstrap import bootstrap
    from sendqueue.settings import Settings

    app = bootstrap(Settings(_env_file=None, database_url=store_url, scheduler_url=scheduler_url))
    try:
        app.store.get_campaign(_CID)
        _ = app.scheduler
        started = time.perf_counter()
        report = app.reconciler.run()
        return time.perf_counter() - started, report
    finally:
        app.close()


def _delete_schedules(home: Path, count: int) -> None:
    sched = sqlite3.connect(home / "scheduler.db", isolation_level=None)
    sched.execute(
        "DELETE FROM schedules WHERE name IN (SELECT name FROM schedules ORDER BY name LIMIT ?)",
        (count,),
    )
    sched.close()


def run(*, small: int, large: int, pending: int, missing: int, repeats: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"small": [], "large": [], "repair": []}
    repaired: list[int] = []
    with tempfile.TemporaryDirectory(prefix="sq-bench-rec-") as tmp:
        homes = {}
        build_s = {}
        for label, total in (("small", small), ("large", large)):
            home = Path(tmp) / label
            home.mkdir()
            started = time.perf_counter()
            homes[label] = (home, *build(home, total, pending))
            build_s[label] = time.perf_counter() - started
        for n in range(repeats):
            for label in ("small", "large") if n % 2 == 0 else ("large", "small"):
                _, store_url, scheduler_url = homes[label]
                seconds, report = _pass(store_url, scheduler_url)
                if report.repairs or report.errors:
                    raise AssertionError(f"a clean store needed repairs: {report.as_dict()}")
                times[label].append(seconds)
        home, store_url, scheduler_url = homes["large"]
        for _ in range(repeats):
            _delete_schedules(home, missing)
            seconds, report = _pass(store_url, scheduler_url)
            repaired.append(report.missing_schedules_created)
            times["repair"].append(seconds)
    if set(repaired) != {missing}:
        raise AssertionError(f"repaired {repaired}, expected {missing} each time")
    small_s, large_s = summarize(times["small"]), summarize(times["large"])
    ratio = large_s.median / small_s.median
    return {
        "small_tasks": small,
        "large_tasks": large,
        "pending": pending,
        "missing": missing,
        "repeats": repeats,
        "build_seconds": build_s,
        "small_pass_seconds": small_s.as_dict(),
        "large_pass_seconds": large_s.as_dict(),
        "repair_pass_seconds": summarize(times["repair"]).as_dict(),
        "ratio": ratio,
        "targets": [
            {
                "name": f"reconciler: the {large:,}-task pass within 2x the {small:,}-task pass",
                "value": ratio,
                "limit": TARGET,
                "unit": "x",
                "passed": ratio <= TARGET,
            }
        ],
    }
