"""A page of tasks never ends between one recipient's steps while more follow."""

from __future__ import annotations

from dataclasses import replace

from sendqueue.domain.models import Campaign, Recipient, Task, task_id
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.reads import whole_positions
from sendqueue.services.planning.replanning import iter_tasks
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.testing.tasks import bare_task
from tests.support.app import T0


def _task(position: int, step: int) -> Task:
    base = bare_task("c0123456789ab", position, T0)
    return replace(base, id=task_id("c0123456789ab", position, step), step=step)


def test_a_cut_position_is_left_for_the_next_page_and_steps_are_in_order() -> None:
    page = [_task(0, 1), _task(1, 2), _task(1, 1), _task(2, 1)]
    assert [(t.position, t.step) for t in whole_positions(page, more=True, sequence=True)] == [
        (0, 1), (1, 1), (1, 2),
    ]  # fmt: skip
    assert [(t.position, t.step) for t in whole_positions(page, more=False, sequence=True)] == [
        (0, 1), (1, 1), (1, 2), (2, 1),
    ]  # fmt: skip


def test_a_campaign_of_one_step_keeps_its_page_as_read() -> None:
    page = [_task(0, 1), _task(1, 1), _task(2, 1)]
    assert whole_positions(page, more=True, sequence=False) == page


def test_a_page_of_one_position_is_kept_whole() -> None:
    page = [_task(3, 2), _task(3, 1)]
    assert [t.step for t in whole_positions(page, more=True, sequence=True)] == [1, 2]


def test_iterating_a_campaigns_tasks_misses_no_step_where_a_page_ends() -> None:
    store = InMemoryTaskStore()
    cid = "c0123456789ab"
    store.create_campaign(
        Campaign(id=cid, name="n", policy=SendingPolicy(), from_addr="a@example.com"),
        [Recipient(p, f"r{p}@example.com") for p in range(5)],
    )
    tasks = [
        replace(bare_task(cid, p, T0), id=task_id(cid, p, k), step=k)
        for p in range(5)
        for k in (1, 2, 3)
    ]
    store.insert_tasks(tasks, at=T0)

    seen = [(t.position, t.step) for t in iter_tasks(store, cid, page=11)]

    assert sorted(seen) == sorted((t.position, t.step) for t in tasks)
    assert len(seen) == len(set(seen))
