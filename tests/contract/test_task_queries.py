"""The Tasks contract's queries (sendqueue.ports.Tasks): paging a campaign's tasks, due and
stale tasks, what is unfinished and the counts per state, run against every backend of
:mod:`tests.contract.store_backends`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.ports import TaskStore
from tests.contract.store_backends import (
    T0,
    S,
    backend,
    campaign,
    drive,
    make_task,
    store,
    with_tasks,
)

__all__ = ["backend", "store"]  # the fixtures: every backend's store


# --- queries ----------------------------------------------------------------------------------


def test_list_tasks_pages_with_state_filter_and_search(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    emails = {
        3: "a%b@example.com",
        4: "a_b@example.com",
        5: "axb@example.com",
        6: "aXYb@example.com",
        7: "Mixed.Case@Example.COM",
        8: "back\\slash@example.com",
    }
    tasks = [make_task("c1", i, email=emails.get(i, f"r{i}@example.org")) for i in range(30)]
    store.insert_tasks(list(reversed(tasks)), at=T0)
    for t in tasks[::3]:
        drive(store, t.id, S.RUNNING)

    def pages(**kw: Any) -> list[list[Task]]:
        out: list[list[Task]] = []
        after = -1
        while page := store.list_tasks("c1", after=after, limit=4, **kw):
            out.append(page)
            after = page[-1].position
        return out

    every = pages()
    assert [len(p) for p in every] == [4] * 7 + [2]
    assert [t.position for p in every for t in p] == list(range(30))

    running = pages(state=S.RUNNING)
    assert [t.position for p in running for t in p] == list(range(0, 30, 3))
    assert all(t.state is S.RUNNING for p in running for t in p)

    def found(search: str, state: TaskState | None = None) -> list[int]:
        return [t.position for p in pages(search=search, state=state) for t in p]

    assert found("a%b") == [3]
    assert found("a_b") == [4]
    assert found("%") == [3]
    assert found("_") == [4]
    assert found("\\") == [8]
    assert found("mixed.case@EXAMPLE") == [7]
    assert found("@example.org") == [i for i in range(30) if i not in emails]
    assert found("@example.org", S.PENDING) == [i for i in range(30) if i not in emails and i % 3]
    assert found("nobody") == []


def test_list_tasks_filters_by_step(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    tasks = [
        make_task("c1", p, id=task_id("c1", p, step), step=step)
        for p in range(12)
        for step in (1, 2, 3)
        if step == 1 or p % step == 0
    ]
    store.insert_tasks(tasks, at=T0)
    drive(store, task_id("c1", 6, 2), S.RUNNING)

    def pages(step: int, **kw: Any) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        after = -1
        while page := store.list_tasks("c1", after=after, limit=2, step=step, **kw):
            out += [(t.position, t.step) for t in page]
            after = page[-1].position
        return out

    assert pages(1) == [(p, 1) for p in range(12)]
    assert pages(2) == [(p, 2) for p in range(0, 12, 2)]
    assert pages(3) == [(p, 3) for p in range(0, 12, 3)]
    assert pages(4) == []
    assert pages(2, state=S.RUNNING) == [(6, 2)]
    assert pages(2, state=S.PENDING, search="R4@") == [(4, 2)]
    assert [t.id for t in store.list_tasks("c1", step=3, after=3)] == ["c1-6-s3", "c1-9-s3"]
    # Without a step: every step's tasks, in position order.
    everything = store.list_tasks("c1", limit=100)
    assert sorted((t.position, t.step) for t in everything) == sorted(
        (t.position, t.step) for t in tasks
    )
    assert [t.position for t in everything] == sorted(t.position for t in tasks)
    for bad in (0, 11):
        with pytest.raises(InvalidField) as info:
            store.list_tasks("c1", step=bad)
        assert info.value.field == "step"


def test_due_tasks_in_send_order_with_cursor(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    same = T0 + timedelta(minutes=5)
    tasks = [
        make_task("c1", 0, send_at=T0 + timedelta(minutes=9)),
        make_task("c1", 1, send_at=same, id="c1-b"),
        make_task("c1", 2, send_at=same, id="c1-a"),
        make_task("c1", 3, send_at=T0 + timedelta(minutes=1)),
        make_task("c1", 4, send_at=T0 + timedelta(minutes=20)),
        make_task("c1", 5, send_at=same, id="c1-c"),
        make_task("c1", 6, send_at=T0 + timedelta(minutes=2)),
    ]
    store.insert_tasks(tasks, at=T0)
    drive(store, task_id("c1", 6), S.RUNNING)
    before = T0 + timedelta(minutes=20)  # exclusive: position 4 is not due

    due = store.due_tasks(S.PENDING, before=before)
    expected = [task_id("c1", 3), "c1-a", "c1-b", "c1-c", task_id("c1", 0)]
    assert [t.id for t in due] == expected

    paged: list[str] = []
    cursor: tuple[datetime, str] | None = None
    while page := store.due_tasks(S.PENDING, before=before, after=cursor, limit=2):
        paged.extend(t.id for t in page)
        cursor = (page[-1].send_at, page[-1].id)
    assert paged == expected
    assert [t.id for t in store.due_tasks(S.RUNNING, before=before)] == [task_id("c1", 6)]


def test_stale_running_oldest_claim_first(store: TaskStore) -> None:
    tasks = with_tasks(store, count=5)
    claims = {0: 30, 1: 10, 2: 20, 4: 50}
    for position, minutes in claims.items():
        at = T0 + timedelta(minutes=minutes)
        store.transition(
            tasks[position].id, S.PENDING, S.RUNNING, at=at, changes={"claimed_at": at}
        )

    stale = store.stale_running(claimed_before=T0 + timedelta(minutes=50))
    assert [t.position for t in stale] == [1, 2, 0]
    first_two = store.stale_running(claimed_before=T0 + timedelta(hours=1), limit=2)
    assert [t.position for t in first_two] == [1, 2]
    assert store.stale_running(claimed_before=T0 + timedelta(minutes=10)) == []


def test_has_unfinished_tasks_sees_pending_and_running_only(store: TaskStore) -> None:
    assert store.has_unfinished_tasks("nope") is False
    tasks = with_tasks(store, "c1", count=3)
    assert store.has_unfinished_tasks("c1") is True
    drive(store, tasks[0].id, S.RUNNING)
    store.transition(tasks[0].id, S.RUNNING, S.FINISHED, at=T0)
    drive(store, tasks[1].id, S.RUNNING)
    store.transition(tasks[2].id, S.PENDING, S.CANCELLED, at=T0)
    assert store.has_unfinished_tasks("c1") is True  # one is Running
    store.transition(tasks[1].id, S.RUNNING, S.FAILED, at=T0)
    assert store.has_unfinished_tasks("c1") is False


def test_count_tasks_has_every_state(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    assert store.count_tasks("c1") == dict.fromkeys(TaskState, 0)

    tasks = with_tasks(store, "c2", count=6)
    drive(store, tasks[0].id, S.RUNNING)
    drive(store, tasks[1].id, S.FAILED)
    drive(store, tasks[2].id, S.RUNNING)
    store.transition(tasks[2].id, S.RUNNING, S.FINISHED, at=T0)
    store.transition(tasks[3].id, S.PENDING, S.CANCELLED, at=T0)

    assert store.count_tasks("c2") == {
        S.PENDING: 2,
        S.RUNNING: 1,
        S.FINISHED: 1,
        S.FAILED: 1,
        S.CANCELLED: 1,
    }
    assert store.count_tasks("c1") == dict.fromkeys(TaskState, 0)
