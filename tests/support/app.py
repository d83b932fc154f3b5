"""Build a fully wired sendqueue container on fakes (or real adapters) for tests."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.ports import Scheduler, StoreBackend, TaskStore
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore

__all__ = [
    "LENIENT_LATENESS",
    "claim_and_finish_from_threads",
    "csv_bytes",
    "fake_app",
    "open_policy",
]

#: A Tuesday, 08:00 UTC = 09:00 in Berlin.
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)

#: fake_app's default SENDQUEUE_MAX_LATENESS (seconds): 30 days.
LENIENT_LATENESS = 30 * 86_400.0


def fake_app(
    *,
    clock: FakeClock | None = None,
    store: StoreBackend | None = None,
    scheduler: Scheduler | None = None,
    mailer: RecordingMailer | None = None,
    **settings: Any,
) -> Container:
    """A container on in-memory fakes; ``settings`` override Settings fields.

    ``max_lateness`` defaults to 30 days, not 300 s, and ``space_late_sends`` to False: most
    tests jump the clock past many send times at once and check another rule; the tests of the
    catch-up re-plan and of late sends set them. ``follow_up_linger`` defaults to 0: a send's
    next sequence step is made before the send returns, where a test checks it at once.
    """
    clock = clock or FakeClock(T0)
    values: dict[str, Any] = {
        "retry_backoff": 60.0,
        "max_lateness": LENIENT_LATENESS,
        "space_late_sends": False,
        "follow_up_linger": 0.0,
        "_env_file": None,
    }
    values.update(settings)
    return bootstrap(
        Settings(**values),
        clock=clock,
        store=store or InMemoryTaskStore(),
        scheduler=scheduler or FakeScheduler(clock, seed=1),
        mailer=mailer or RecordingMailer(),
    )


def open_policy(start: datetime = T0, per_day: int = 10_000, **kw: Any) -> SendingPolicy:
    """Every day, all day, many per day: sends every few seconds from ``start``."""
    return SendingPolicy(
        timezone=kw.pop("timezone", "UTC"),
        per_day=per_day,
        weekdays=frozenset(range(7)),
        windows=(Window(0, 1440),),
        start=start,
        **kw,
    )


def csv_bytes(count: int, *, prefix: str = "user") -> bytes:
    rows = ["email,name,subject,body"]
    rows += [f"{prefix}{i}@example.com,User {i},Hello {i},Body {i}" for i in range(count)]
    return ("\n".join(rows) + "\n").encode()


def claim_and_finish_from_threads(store: TaskStore, cid: str, ids: list[str]) -> None:
    """Four threads race to claim and finish every task of ``ids`` (all Pending): each is
    claimed exactly once, and every change is logged once, in id order."""
    before = store.last_change_id()
    claimed: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for task_id in ids:
            task = store.transition(task_id, TaskState.PENDING, TaskState.RUNNING, at=T0)
            if task is None:
                continue  # another thread won the compare-and-set
            with lock:
                claimed.append(task_id)
            assert store.campaign_state(cid).value in {"active", "provisioning"}
            assert store.transition(task_id, TaskState.RUNNING, TaskState.FINISHED, at=T0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(ids)  # each claimed exactly once
    assert store.count_tasks(cid)[TaskState.FINISHED] == len(ids)
    assert not store.has_unfinished_tasks(cid)
    entries = store.changes_after(before, campaign_id=cid, limit=2 * len(ids) + 1)
    assert len(entries) == 2 * len(ids)  # Pending -> Running and Running -> Finished, once each
    assert [e.id for e in entries] == sorted(e.id for e in entries)
