"""The Tasks contract (sendqueue.ports.Tasks): inserting tasks, their state machine, moves and
the reads the planner makes, and two handles racing for one task, run against every backend of
:mod:`tests.contract.store_backends`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sendqueue.domain.errors import IllegalTransition, InvalidField
from sendqueue.domain.lifecycle import TASK_TRANSITIONS, TaskState
from sendqueue.domain.models import Move, Task, task_id
from sendqueue.ports import TaskStore
from tests.contract.store_backends import (
    T0,
    Backend,
    S,
    all_changes,
    backend,
    campaign,
    drive,
    is_utc,
    make_task,
    recipients,
    store,
    with_tasks,
)

__all__ = ["backend", "store"]  # the fixtures: every backend's store


# --- inserting tasks --------------------------------------------------------------------------


def test_insert_tasks_is_idempotent_and_logs_each_insert_once(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(15))
    first = [make_task("c1", i) for i in range(10)]
    assert store.insert_tasks(first, at=T0) == 10

    later = T0 + timedelta(hours=1)
    again = [replace(t, token="other", subject="changed") for t in first]
    more = [make_task("c1", i) for i in range(10, 15)]
    assert store.insert_tasks(again + more, at=later) == 5
    assert store.insert_tasks(again + more, at=later) == 0

    # Existing tasks were left untouched.
    assert store.get_task(first[0].id) == replace(
        first[0], created_at=T0, updated_at=T0, planned_at=first[0].send_at
    )
    entries = all_changes(store)
    assert [(e.task_id, e.from_state, e.to_state) for e in entries] == [
        (t.id, None, "Pending") for t in first + more
    ]
    assert [e.at for e in entries] == [T0] * 10 + [later] * 5
    assert store.count_tasks("c1")[S.PENDING] == 15


def test_insert_tasks_skips_a_second_task_for_a_taken_position(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(1))
    assert store.insert_tasks([make_task("c1", 0)], at=T0) == 1
    assert store.insert_tasks([make_task("c1", 0, id="c1-other")], at=T0) == 0
    assert store.get_task("c1-other") is None
    assert store.insert_tasks([], at=T0) == 0


def step_task(cid: str, position: int, step: int, **kw: Any) -> Task:
    """``make_task`` of ``step``, with that step's id and its own subject."""
    values: dict[str, Any] = {"id": task_id(cid, position, step), "subject": f"Step {step}"}
    values.update(kw)
    return make_task(cid, position, step=step, **values)


def test_a_task_of_a_later_step_reads_back_with_its_step_everywhere(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(2))
    first, third = make_task("c1", 0), step_task("c1", 0, 3)
    assert store.insert_tasks([first, third, step_task("c1", 1, 2)], at=T0) == 3

    got = store.get_task(task_id("c1", 0, 3))
    assert got == replace(third, created_at=T0, updated_at=T0, planned_at=third.send_at)
    assert got is not None and got.step == 3 and got.id == "c1-0-s3"
    assert {i: t.step for i, t in store.get_tasks([first.id, third.id, "c1-1-s2"]).items()} == {
        "c1-0": 1,
        "c1-0-s3": 3,
        "c1-1-s2": 2,
    }
    moved = store.transition(third.id, S.PENDING, S.RUNNING, at=T0, changes={"claimed_at": T0})
    assert moved is not None and moved.step == 3
    assert store.transition_all("c1", S.RUNNING, S.PENDING, at=T0) == 1
    back = store.get_task(third.id)
    assert back is not None and (back.state, back.step) == (S.PENDING, 3)
    assert store.reschedule([Move(third.id, third.token, T0, "t2")], at=T0, reason="r") == 1
    again = store.get_task(third.id)
    assert again is not None and (again.token, again.step) == ("t2", 3)


def test_a_recipient_gets_one_task_per_step(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(1))
    steps = [step_task("c1", 0, step) for step in range(1, 11)]
    assert store.insert_tasks(steps[:4], at=T0) == 4
    # Idempotent per step: the same ids, or another id for a (position, step) taken.
    assert store.insert_tasks(steps, at=T0) == 6
    assert store.insert_tasks([step_task("c1", 0, 3, id="c1-other")], at=T0) == 0
    assert store.get_task("c1-other") is None
    assert sorted(t.step for t in store.get_tasks([t.id for t in steps]).values()) == list(
        range(1, 11)
    )
    assert store.count_tasks("c1")[S.PENDING] == 10
    created = [(e.task_id, e.to_state) for e in all_changes(store)]
    assert created == [(t.id, "Pending") for t in steps]


@pytest.mark.parametrize("step", [0, 11])
def test_insert_tasks_refuses_a_step_outside_one_to_ten(store: TaskStore, step: int) -> None:
    store.create_campaign(campaign(), recipients(1))
    with pytest.raises(InvalidField) as info:
        store.insert_tasks([make_task("c1", 0), make_task("c1", 0, id="c1-x", step=step)], at=T0)
    assert info.value.field == "step"
    assert store.get_task(task_id("c1", 0)) is None
    assert store.last_change_id() == 0


def test_insert_tasks_refuses_tasks_that_are_not_pending(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(2))
    with pytest.raises(IllegalTransition):
        store.insert_tasks([make_task("c1", 0), make_task("c1", 1, state=S.FINISHED)], at=T0)
    assert store.get_task(task_id("c1", 0)) is None
    assert store.last_change_id() == 0


def test_bulk_insert_of_twenty_thousand_tasks(backend: Backend, store: TaskStore) -> None:
    count = backend.bulk_tasks
    store.create_campaign(campaign(), [])
    tasks = [make_task("c1", i, send_at=T0 + timedelta(seconds=i)) for i in range(count)]

    assert store.insert_tasks(tasks, at=T0) == count

    assert store.count_tasks("c1")[S.PENDING] == count
    created = store.changes_after(0, limit=count + 1)
    assert [(e.task_id, e.to_state) for e in created] == [(t.id, "Pending") for t in tasks]
    assert store.last_change_id() == created[-1].id
    assert store.transition_all("c1", S.PENDING, S.CANCELLED, at=T0) == count
    assert store.count_tasks("c1")[S.CANCELLED] == count
    # Ids are strictly increasing, not dense (PostgreSQL's encode the writing transaction).
    cancelled = store.changes_after(created[-1].id, limit=count + 1)
    assert len(cancelled) == count
    tail = store.changes_after(cancelled[-3].id)
    assert [(e.task_id, e.to_state) for e in tail] == [
        (task_id("c1", count - 2), "Cancelled"),
        (task_id("c1", count - 1), "Cancelled"),
    ]
    assert store.last_change_id() == tail[-1].id


# --- transitions ------------------------------------------------------------------------------


def test_every_legal_transition_applies_and_is_logged(store: TaskStore) -> None:
    pairs = list(TASK_TRANSITIONS)
    with_tasks(store, count=len(pairs))
    at = T0 + timedelta(minutes=30)

    for position, (source, target) in enumerate(pairs):
        tid = task_id("c1", position)
        drive(store, tid, source)
        before = store.last_change_id()

        moved = store.transition(tid, source, target, at=at, note=f"{source}->{target}")

        assert moved is not None
        assert (moved.state, moved.updated_at) == (target, at)
        assert store.get_task(tid) == moved
        [entry] = store.changes_after(before)
        assert (entry.campaign_id, entry.task_id, entry.from_state, entry.to_state) == (
            "c1",
            tid,
            source.value,
            target.value,
        )
        assert (entry.at, entry.note) == (at, f"{source}->{target}")


def test_transition_is_compare_and_set(store: TaskStore) -> None:
    [task, *_] = with_tasks(store, count=2)
    before = store.last_change_id()

    assert store.transition(task.id, S.RUNNING, S.FINISHED, at=T0) is None
    assert store.transition("no-such-task", S.PENDING, S.RUNNING, at=T0) is None
    assert store.transition(task.id, S.PENDING, S.RUNNING, at=T0) is not None
    assert store.transition(task.id, S.PENDING, S.RUNNING, at=T0) is None
    assert store.transition(task.id, S.PENDING, S.CANCELLED, at=T0) is None

    current = store.get_task(task.id)
    assert current is not None
    assert current.state is S.RUNNING
    # Only the one transition that applied was logged.
    assert [(e.from_state, e.to_state) for e in store.changes_after(before)] == [
        ("Pending", "Running")
    ]


def test_illegal_transitions_raise_and_change_nothing(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    before = store.last_change_id()

    for source in TaskState:
        for target in TaskState:
            if (source, target) in TASK_TRANSITIONS:
                continue
            with pytest.raises(IllegalTransition):
                store.transition(task.id, source, target, at=T0)
            with pytest.raises(IllegalTransition):
                store.transition_all("c1", source, target, at=T0)

    assert store.get_task(task.id) == replace(
        task, created_at=T0, updated_at=T0, planned_at=task.send_at
    )
    assert store.last_change_id() == before


def test_transition_applies_changes(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    claimed = T0 + timedelta(seconds=1)
    sent = T0 + timedelta(seconds=2)

    running = store.transition(
        task.id, S.PENDING, S.RUNNING, at=claimed, changes={"claimed_at": claimed, "attempts": 1}
    )
    assert running is not None
    assert (running.claimed_at, running.attempts, running.token) == (claimed, 1, task.token)

    done = store.transition(
        task.id,
        S.RUNNING,
        S.FINISHED,
        at=sent,
        changes={"sent_at": sent, "message_id": "<m1@example.com>", "error": None},
    )
    assert done is not None
    assert (done.state, done.sent_at, done.message_id, done.error) == (
        S.FINISHED,
        sent,
        "<m1@example.com>",
        None,
    )
    assert (done.claimed_at, done.attempts, done.created_at, done.updated_at) == (
        claimed,
        1,
        T0,
        sent,
    )
    assert store.get_task(task.id) == done


def test_transition_back_to_pending_can_reschedule(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    drive(store, task.id, S.RUNNING)
    retry_at = T0 + timedelta(minutes=10)

    back = store.transition(
        task.id,
        S.RUNNING,
        S.PENDING,
        at=T0,
        changes={"send_at": retry_at, "token": "retry1", "claimed_at": None, "error": "451"},
    )

    assert back is not None
    assert (back.state, back.send_at, back.token, back.claimed_at, back.error) == (
        S.PENDING,
        retry_at,
        "retry1",
        None,
        "451",
    )


def test_transition_refuses_unknown_change_fields(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    with pytest.raises(InvalidField):
        store.transition(task.id, S.PENDING, S.RUNNING, at=T0, changes={"state": "x"})  # type: ignore[arg-type]
    current = store.get_task(task.id)
    assert current is not None
    assert current.state is S.PENDING


def test_transition_all_moves_every_matching_task_and_logs_each(store: TaskStore) -> None:
    tasks = with_tasks(store, "c1", count=10)
    with_tasks(store, "c2", count=3)
    for t in tasks[:3]:
        drive(store, t.id, S.RUNNING)
    before = store.last_change_id()
    at = T0 + timedelta(hours=1)

    assert store.transition_all("c1", S.PENDING, S.CANCELLED, at=at, note="cancel") == 7

    entries = store.changes_after(before)
    assert [(e.task_id, e.from_state, e.to_state, e.note, e.at) for e in entries] == [
        (t.id, "Pending", "Cancelled", "cancel", at) for t in tasks[3:]
    ]
    counts = store.count_tasks("c1")
    assert (counts[S.RUNNING], counts[S.CANCELLED], counts[S.PENDING]) == (3, 7, 0)
    assert store.count_tasks("c2")[S.PENDING] == 3
    cancelled = store.get_task(tasks[5].id)
    assert cancelled is not None
    assert cancelled.updated_at == at
    # Nothing left to move: nothing logged.
    assert store.transition_all("c1", S.PENDING, S.CANCELLED, at=at) == 0
    assert store.last_change_id() == entries[-1].id


def test_reschedule_moves_pending_tasks_holding_the_token_and_logs_each(
    store: TaskStore,
) -> None:
    tasks = with_tasks(store, count=5)
    drive(store, tasks[1].id, S.RUNNING)
    drive(store, tasks[2].id, S.FAILED)
    before = store.last_change_id()
    new_time = T0 + timedelta(days=1)
    at = T0 + timedelta(hours=1)
    moves = [
        Move(t.id, t.token, new_time + timedelta(minutes=i), f"new{i}") for i, t in enumerate(tasks)
    ]
    moves[4] = moves[4]._replace(token="not-the-current-token")

    updated = store.reschedule(
        [*moves, Move("no-such-task", "x", new_time, "y")], at=at, reason="worker down"
    )

    assert updated == 2
    got = [store.get_task(t.id) for t in tasks]
    assert [(g.send_at, g.token, g.moves, g.moved_reason) for g in got if g] == [
        (new_time, "new0", 1, "worker down"),
        (tasks[1].send_at, tasks[1].token, 0, None),
        (tasks[2].send_at, tasks[2].token, 0, None),
        (new_time + timedelta(minutes=3), "new3", 1, "worker down"),
        (tasks[4].send_at, tasks[4].token, 0, None),
    ]
    assert got[0] is not None
    assert got[0].updated_at == at
    # the first planned instant stays
    assert got[0].planned_at == tasks[0].send_at
    assert [
        (e.task_id, e.from_state, e.to_state, e.note, e.at) for e in store.changes_after(before)
    ] == [
        (tasks[0].id, "Pending", "Pending", "moved: worker down", at),
        (tasks[3].id, "Pending", "Pending", "moved: worker down", at),
    ]
    # a second move counts again; the old token no longer matches
    assert store.reschedule([moves[0]], at=at, reason="again") == 0
    again = Move(tasks[0].id, "new0", new_time, "newer")
    assert store.reschedule([again], at=at, reason="again") == 1
    moved = store.get_task(tasks[0].id)
    assert moved is not None
    assert (moved.moves, moved.moved_reason, moved.token) == (2, "again", "newer")
    assert store.reschedule([], at=at, reason="nothing") == 0


def test_new_tasks_are_planned_at_their_send_time_and_never_moved(store: TaskStore) -> None:
    tasks = with_tasks(store, count=2)
    for task in tasks:
        got = store.get_task(task.id)
        assert got is not None
        assert got.planned_at == task.send_at
        assert (got.moves, got.moved_reason) == (0, None)
        [listed] = [t for t in store.list_tasks("c1") if t.id == task.id]
        assert listed.planned_at == task.send_at


def test_transition_can_count_a_move(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    drive(store, task.id, S.RUNNING)
    later = T0 + timedelta(days=1)
    back = store.transition(
        task.id, S.RUNNING, S.PENDING, at=T0,
        changes={"send_at": later, "token": "t2", "moves": 1, "moved_reason": "transient: 421"},
    )  # fmt: skip
    assert back is not None
    got = store.get_task(task.id)
    assert got is not None
    assert (got.send_at, got.moves, got.moved_reason) == (later, 1, "transient: 421")
    assert got.planned_at == task.send_at


def test_get_tasks_reads_many_by_id_as_get_task_does(backend: Backend, store: TaskStore) -> None:
    """More ids than one DynamoDB BatchGetItem takes (100), unknown and repeated ids among
    them, and changes made through another handle just before: each found task as current
    as ``get_task`` reads it, the unknown ones left out."""
    tasks = with_tasks(store, count=250)
    other = backend.handle()
    for task in tasks[::7]:
        drive(other, task.id, S.RUNNING)
    wanted = [t.id for t in reversed(tasks)] + [tasks[3].id, "c1-nope", task_id("c2", 0)]
    got = store.get_tasks(wanted)
    assert sorted(got) == sorted(t.id for t in tasks)
    assert got == {t.id: store.get_task(t.id) for t in tasks}
    assert {tid for tid, t in got.items() if t.state is S.RUNNING} == {t.id for t in tasks[::7]}
    assert store.get_tasks([]) == {}
    assert store.get_tasks(["c1-nope"]) == {}


def test_booked_lists_sent_claimed_and_planned_instants(store: TaskStore) -> None:
    tasks = with_tasks(store, count=6)
    with_tasks(store, "c2", count=2)  # another campaign's sends are not booked
    sent_at = T0 + timedelta(minutes=30)
    drive(store, tasks[0].id, S.RUNNING, at=T0 + timedelta(minutes=20))
    store.transition(tasks[0].id, S.RUNNING, S.FINISHED, at=sent_at, changes={"sent_at": sent_at})
    drive(store, tasks[1].id, S.RUNNING, at=T0 + timedelta(minutes=40))
    drive(store, tasks[2].id, S.FAILED)
    store.transition(tasks[3].id, S.PENDING, S.CANCELLED, at=T0)
    # tasks 4 and 5 stay Pending, at T0+4min and T0+5min

    got = store.booked("c1", since=T0)
    assert sorted(got) == sorted(
        [
            (S.FINISHED, sent_at),
            (S.RUNNING, T0 + timedelta(minutes=40)),
            (S.PENDING, tasks[4].send_at),
            (S.PENDING, tasks[5].send_at),
        ]
    )
    assert all(is_utc(when) for _, when in got)
    # [since, until): the Pending ones at 4 and 5 minutes only
    window = store.booked("c1", since=T0 + timedelta(minutes=4), until=T0 + timedelta(minutes=30))
    assert sorted(window) == [(S.PENDING, tasks[4].send_at), (S.PENDING, tasks[5].send_at)]
    assert store.booked("c1", since=T0 + timedelta(hours=1)) == []
    assert store.booked("no-such-campaign", since=T0) == []


def test_count_moves_counts_moved_and_late_tasks(store: TaskStore) -> None:
    tasks = with_tasks(store, count=5)
    with_tasks(store, "c2", count=1)
    assert store.count_moves("c1", late_after=60) == (0, 0)
    store.reschedule([Move(tasks[0].id, tasks[0].token, T0, "n0")], at=T0, reason="r")
    for task, late_by in ((tasks[1], 61), (tasks[2], 30), (tasks[3], 60)):
        drive(store, task.id, S.RUNNING)
        sent = task.send_at + timedelta(seconds=late_by)
        store.transition(task.id, S.RUNNING, S.FINISHED, at=sent, changes={"sent_at": sent})
    assert store.count_moves("c1", late_after=60) == (1, 1)
    assert store.count_moves("c1", late_after=10) == (1, 3)
    assert store.count_moves("c2", late_after=60) == (0, 0)
    assert store.count_moves("no-such-campaign", late_after=60) == (0, 0)


# --- concurrency ------------------------------------------------------------------------------


def race(claimers: Sequence[TaskStore], tid: str) -> list[object]:
    """Let every claimer try Pending -> Running on ``tid`` at the same moment."""
    barrier = threading.Barrier(len(claimers))
    results: list[object] = [None] * len(claimers)

    def claim(i: int) -> None:
        barrier.wait()
        try:
            results[i] = claimers[i].transition(
                tid, S.PENDING, S.RUNNING, at=T0, changes={"claimed_at": T0}
            )
        except BaseException as exc:  # reported by the caller, with the round
            results[i] = exc

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(claimers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_claimers_race_and_exactly_one_wins(backend: Backend) -> None:
    rounds = 50
    setup = backend.handle()
    with_tasks(setup, count=rounds)
    claimers = [backend.handle(), backend.handle()]

    for position in range(rounds):
        results = race(claimers, task_id("c1", position))
        assert not [r for r in results if isinstance(r, BaseException)], (position, results)
        assert len([r for r in results if isinstance(r, Task)]) == 1, (position, results)

    entries = all_changes(setup)
    claims = [e.task_id for e in entries if e.to_state == "Running"]
    assert sorted(claims, key=str) == sorted(task_id("c1", p) for p in range(rounds))
    assert setup.count_tasks("c1")[S.RUNNING] == rounds


def test_concurrent_inserts_of_the_same_tasks_insert_each_once(backend: Backend) -> None:
    count = 2000
    setup = backend.handle()
    setup.create_campaign(campaign(), [])
    tasks = [make_task("c1", i) for i in range(count)]
    orders = [tasks, list(reversed(tasks)), tasks[count // 2 :] + tasks[: count // 2]]
    handles = [backend.handle() for _ in orders]
    barrier = threading.Barrier(len(orders))
    results: list[object] = [None] * len(orders)

    def insert(i: int) -> None:
        barrier.wait()
        try:
            results[i] = handles[i].insert_tasks(orders[i], at=T0)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(len(orders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert all(isinstance(r, int) for r in results), results
    assert sum(r for r in results if isinstance(r, int)) == count
    entries = all_changes(setup)
    assert sorted(e.task_id or "" for e in entries) == sorted(t.id for t in tasks)
    assert setup.count_tasks("c1")[S.PENDING] == count
