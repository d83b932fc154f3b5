"""The whole send path seen from the task store, for the benchmarks that run it: a campaign of
tasks due at given instants with their schedules, waiting until a campaign is sent, and when
each task was claimed (the fire) and sent (SMTP accepted, Finished).

Shared by :mod:`bench.dispatch` (``sendqueue-full``), :mod:`bench.throughput` and
:mod:`bench.fleet`; everything goes through the container's ports, so it works the same on
every store and execution layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, Task, new_token
from sendqueue.domain.policy import MAX_PER_DAY, SendingPolicy, Window

__all__ = ["add_campaign", "task_times", "tasks_of", "wait_sent"]

_CHUNK = 2000


def add_campaign(app: Container, cid: str, due: list[float]) -> float:
    """A campaign ``cid`` sending all day every day, with one task per epoch instant of ``due``
    and their schedules (through the schedule writer, as provisioning does). Returns the
    seconds taken.

    The tasks are in before the campaign turns Active, so a worker running meanwhile never
    sees it Active with nothing left to send (it would complete it).
    """
    started = time.perf_counter()
    now = datetime.now(UTC)
    campaign = Campaign(
        id=cid,
        name=cid,
        policy=SendingPolicy(
            timezone="UTC",
            per_day=MAX_PER_DAY,  # not what is measured: the tasks are written directly
            weekdays=frozenset(range(7)),
            windows=(Window(0, 1440),),
        ),
        from_addr="bench@example.com",
        created_at=now,
        updated_at=now,
    )
    app.store.create_campaign(campaign, [])
    tasks = [
        Task(
            id=f"{cid}-{i}",
            campaign_id=cid,
            position=i,
            email=f"r{i}@example.com",
            name=f"R {i}",
            subject="Hello",
            text="A benchmark message.",
            html=None,
            send_at=datetime.fromtimestamp(at, UTC),
            token=new_token(),
        )
        for i, at in enumerate(due)
    ]
    for start in range(0, len(tasks), _CHUNK):
        app.store.insert_tasks(tasks[start : start + _CHUNK], at=datetime.now(UTC))
    for old, new in (
        (CampaignState.DRAFT, CampaignState.PROVISIONING),
        (CampaignState.PROVISIONING, CampaignState.ACTIVE),
    ):
        app.store.set_campaign_state(cid, {old}, new, at=datetime.now(UTC))
    for start in range(0, len(tasks), _CHUNK):
        report = app.writer.ensure_many(tasks[start : start + _CHUNK])
        if report.failed:
            raise AssertionError(f"schedules not created: {report.failed[:3]}")
    return time.perf_counter() - started


def wait_sent(
    app: Container,
    cid: str,
    deadline: float,
    *,
    every: float = 0.25,
    check: Callable[[], None] | None = None,
) -> bool:
    """Wait until no task of ``cid`` is Pending or Running, or until the monotonic
    ``deadline``; ``check`` runs between polls (it raises to give up). True when all are done."""
    while time.monotonic() < deadline:
        counts = app.store.count_tasks(cid)
        if counts[TaskState.PENDING] == 0 and counts[TaskState.RUNNING] == 0:
            return True
        if check is not None:
            check()
        time.sleep(every)
    return False


def tasks_of(app: Container, cid: str) -> Iterator[Task]:
    """Every task of ``cid``, in position order, read a page at a time."""
    after = -1
    while True:
        page = app.store.list_tasks(cid, after=after, limit=5000)
        yield from page
        if len(page) < 5000:
            return
        after = page[-1].position


def task_times(app: Container, cid: str) -> tuple[dict[int, float], dict[int, float]]:
    """(position -> claimed_at, position -> sent_at of the Finished ones), epoch seconds."""
    claimed: dict[int, float] = {}
    sent: dict[int, float] = {}
    for task in tasks_of(app, cid):
        if task.claimed_at is not None:
            claimed[task.position] = task.claimed_at.timestamp()
        if task.state is TaskState.FINISHED and task.sent_at is not None:
            sent[task.position] = task.sent_at.timestamp()
    return claimed, sent
