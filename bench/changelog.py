"""Benchmark 8: change-log writes under contention on PostgreSQL.

``writers`` threads (8 by default), each with its own store handle, move their own share of a
campaign's tasks Pending -> Running -> Finished through ``TaskStore.transition`` (the send
path's write: one statement, one transaction, one change-log entry). Two variants on fresh
databases, alternated, side by side in one run:

- **before** (the anchor): the same statement with the global transaction-level advisory lock
  taken right before the change-log INSERT, as the store did before the change log dropped it,
  so every writer queues on one lock held through its commit;
- **after**: the store as it is now (no lock; readers wait for settled transactions instead).

During every "after" run a reader tails ``changes_after`` from the last id before the writers
started; at the end its ids must be exactly the log's ids after that point, each once (gaps and
repeats are counted and reported).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from bench.common import alternate, summarize

__all__ = ["OLD_LOCK_KEY", "TARGET", "prepare", "run", "use_locked_statement"]

#: "after" must reach this many times the transactions per second of "before".
TARGET = 3.0

_CID = "bench"

#: The tailing reader's page and its pause once caught up (the live stream's batch and
#: ``poll_interval`` are 1,000 and 0.2 s; the pause is shorter here so the reader is busier).
_PAGE = 1000
_POLL_SECONDS = 0.05

#: The global change-log lock's key, as the store had it ("sq" + 2).
OLD_LOCK_KEY = 0x7371_0002

#: The "before" anchor: the store's transition statement with the global change-log lock, as
#: ``_TRANSITION`` in src/sendqueue/adapters/sql/postgres.py at commit 7166b7d (the parent of
#: 98bb111, which removed the lock): the CAS UPDATE, then the lock (taken only if a row
#: matched), then the change-log INSERT. ``{columns}`` is filled in (the same columns then and
#: now), ``{sets}`` per call.
_LOCKED_TRANSITION = (
    "WITH moved AS (UPDATE tasks SET {{sets}} WHERE id = %s AND state = %s"
    " RETURNING {columns}),"
    f" locked AS (SELECT campaign_id, id, pg_advisory_xact_lock({OLD_LOCK_KEY})"
    " FROM moved),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT campaign_id, id, %s, %s, %s::timestamptz, %s::text FROM locked)"
    " SELECT {columns} FROM moved"
)


def prepare(url: str, tasks: int) -> None:
    from sendqueue.adapters.sql import open_store
    from sendqueue.domain.lifecycle import CampaignState as C
    from sendqueue.domain.models import Campaign
    from sendqueue.domain.policy import SendingPolicy
    from sendqueue.testing.tasks import bare_task

    now = datetime.now(UTC)
    with open_store(url) as store:
        store.create_campaign(
            Campaign(
                id=_CID, name="b", policy=SendingPolicy(), from_addr="b@x.org", created_at=now
            ),
            [],
        )
        store.insert_tasks([bare_task(_CID, i, now) for i in range(tasks)], at=now)
        store.set_campaign_state(_CID, {C.DRAFT}, C.PROVISIONING, at=now)
        store.set_campaign_state(_CID, {C.PROVISIONING}, C.ACTIVE, at=now)


def measure(url: str, *, writers: int, per_writer: int, locked: bool) -> dict[str, Any]:
    """One run on a prepared-here database: transactions per second, and for the lock-free
    store what a tailing reader saw."""
    from sendqueue.adapters.sql import PostgresTaskStore
    from sendqueue.domain.lifecycle import TaskState as S
    from sendqueue.domain.models import TaskChanges, task_id

    prepare(url, writers * per_writer)
    handles = [PostgresTaskStore(url, upgrade=False, pg_idle_connections=1) for _ in range(writers)]
    if locked:
        for h in handles:
            use_locked_statement(h)
    reader = PostgresTaskStore(url, upgrade=False, pg_idle_connections=1)
    start_id = reader.last_change_id()
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers + 1)
    done = threading.Event()
    seen: list[int] = []

    def write(w: int) -> None:
        store = handles[w]
        try:
            barrier.wait()
            for i in range(w * per_writer, (w + 1) * per_writer):
                tid = task_id(_CID, i)
                at = datetime.now(UTC)
                claim = TaskChanges(claimed_at=at)
                if store.transition(tid, S.PENDING, S.RUNNING, at=at, changes=claim) is None:
                    raise RuntimeError(f"{tid} was not claimed")
                sent = TaskChanges(sent_at=at)
                if store.transition(tid, S.RUNNING, S.FINISHED, at=at, changes=sent) is None:
                    raise RuntimeError(f"{tid} was not finished")
        except BaseException as exc:
            errors.append(exc)

    def tail() -> None:
        after = start_id
        try:
            while True:
                finished = done.is_set()
                page = reader.changes_after(after, limit=_PAGE)
                seen.extend(e.id for e in page)
                if page:
                    after = page[-1].id
                elif finished:
                    return
                if len(page) < _PAGE:  # caught up: wait a poll, as the live stream's reader
                    time.sleep(_POLL_SECONDS)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    tailer = threading.Thread(target=tail)
    for t in threads:
        t.start()
    if not locked:
        tailer.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    done.set()
    if not locked:
        tailer.join()
    try:
        if errors:
            raise RuntimeError(f"change-log bench failed: {errors[0]!r}") from errors[0]
        out: dict[str, Any] = {"tx_per_second": writers * per_writer * 2 / elapsed}
        if not locked:
            logged = _all_ids(reader, start_id)
            if len(logged) != writers * per_writer * 2:
                raise RuntimeError(f"{len(logged)} entries logged, not {writers * per_writer * 2}")
            counted: dict[int, int] = {}
            for i in seen:
                counted[i] = counted.get(i, 0) + 1
            out["gaps"] = sum(1 for i in logged if i not in counted)
            out["repeats"] = sum(n - 1 for n in counted.values()) + sum(
                1 for i in counted if i not in set(logged)
            )
            out["in_order"] = seen == sorted(seen)
        return out
    finally:
        for h in handles:
            h.close()
        reader.close()


def use_locked_statement(store: Any) -> None:
    """Point ``store``'s transitions at the old locked statement (same parameters)."""
    from sendqueue.adapters.sql import postgres as pg
    from sendqueue.adapters.sql.rows import TASK_COLUMNS, task_from_row

    statement = _LOCKED_TRANSITION.format(columns=TASK_COLUMNS)

    def transition(
        task_id: str,
        expected: Any,
        new: Any,
        values: Mapping[str, Any],
        at: datetime,
        note: str | None,
    ) -> Any:
        params = [pg._time(v) if isinstance(v, datetime) else v for v in values.values()]
        sql = statement.format(sets=", ".join(f"{name} = %s" for name in values))
        args = (*params, task_id, expected.value, expected.value, new.value, pg._time(at), note)

        def run(db: Any) -> Any:
            found = db.execute(sql, args).fetchall()
            return task_from_row(found[0]) if found else None

        return store._run("transition task", run, write=True)

    store._transition = transition


def _all_ids(store: Any, after: int) -> list[int]:
    out: list[int] = []
    while page := store.changes_after(after, limit=5000):
        out.extend(e.id for e in page)
        after = page[-1].id
    return out


def run(
    *,
    database: Callable[[], AbstractContextManager[str]],
    writers: int = 8,
    per_writer: int = 300,
    repeats: int = 3,
) -> dict[str, Any]:
    """``database()`` gives a fresh PostgreSQL URL per measurement (dropped afterwards)."""
    before: list[float] = []
    after: list[float] = []
    gaps: list[int] = []
    repeats_seen: list[int] = []
    ordered = True

    def one(locked: bool) -> Callable[[int], None]:
        def go(_: int) -> None:
            nonlocal ordered
            with database() as url:
                fig = measure(url, writers=writers, per_writer=per_writer, locked=locked)
            if locked:
                before.append(fig["tx_per_second"])
                return
            after.append(fig["tx_per_second"])
            gaps.append(fig["gaps"])
            repeats_seen.append(fig["repeats"])
            ordered = ordered and fig["in_order"]

        return go

    alternate(repeats, one(True), one(False))
    ratio = summarize(after).median / summarize(before).median
    missed = sum(gaps) + sum(repeats_seen)
    return {
        "writers": writers,
        "transactions": writers * per_writer * 2,
        "before_tx_per_second": summarize(before).as_dict(),
        "after_tx_per_second": summarize(after).as_dict(),
        "ratio": ratio,
        "reader_gaps": sum(gaps),
        "reader_repeats": sum(repeats_seen),
        "reader_in_order": ordered,
        "targets": [
            {
                "name": f"change log: {writers} writers, tx/s without the global lock vs with it",
                "value": ratio,
                "limit": TARGET,
                "unit": "x",
                "passed": ratio >= TARGET,
            },
            {
                "name": "change log: entries the tailing reader missed or saw twice",
                "value": float(missed),
                "limit": 0,
                "unit": "entries",
                "passed": missed == 0 and ordered,
            },
        ],
    }
