"""The send path's two calls (``TaskStore.claim_for_send`` and ``TaskStore.finish_send``), run
against every task store of the TaskStore contract: memory, SQLite, PostgreSQL, DynamoDB on
moto."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sendqueue.domain import transitions
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import task_id
from sendqueue.domain.sendclaim import ClaimRefusal, SendClaim
from sendqueue.domain.senders import Booking, Sender
from sendqueue.domain.suppression import Suppression, SuppressionReason
from sendqueue.ports import StoreBackend
from sendqueue.services.task_changes import apply_change
from tests.contract.store_backends import (
    T0,
    Backend,
    all_changes,
    backend,
    make_task,
    with_tasks,
)

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract

S = TaskState
LATER = T0 + timedelta(hours=1)


Store = StoreBackend


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


def claim(store: Store, tid: str, token: str | None = None, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"token": token, "at": LATER, "due_by": LATER, "not_before": T0}
    args.update(kw)
    return store.claim_for_send(tid, **args)  # type: ignore[arg-type]


@pytest.fixture
def active(store: Store) -> Store:
    with_tasks(store, count=3)
    draft = {CampaignState.DRAFT}
    assert store.set_campaign_state("c1", draft, CampaignState.PROVISIONING, at=T0)
    provisioning = {CampaignState.PROVISIONING}
    assert store.set_campaign_state("c1", provisioning, CampaignState.ACTIVE, at=T0)
    return store


def test_a_due_pending_task_is_claimed_once_with_its_entry(active: Store) -> None:
    store = active
    task = store.get_task("c1-0")
    assert task is not None
    got = claim(store, task.id, task.token)
    assert got.claimed and got.refused is None
    assert got.campaign_state is CampaignState.ACTIVE
    assert got.task is not None and got.task.state is S.RUNNING
    assert (got.task.attempts, got.task.claimed_at) == (1, LATER)
    again = claim(store, task.id, task.token)
    assert again.refused is ClaimRefusal.NOT_PENDING and again.task is not None
    entries = [(e.task_id, e.from_state, e.to_state) for e in all_changes(store, "c1")]
    assert entries.count((task.id, "Pending", "Running")) == 1


def test_the_claim_and_the_finish_write_what_the_domain_transitions_name(active: Store) -> None:
    """Every store's one-call claim and finish set exactly the fields of the named
    transitions (``domain.transitions.claim`` and ``finish``), whatever their SQL."""
    store = active
    before = store.get_task("c1-1")
    assert before is not None
    got = claim(store, before.id, before.token)
    assert got.task is not None
    change = transitions.claim(before, LATER)
    assert got.task.state is change.new
    assert {k: getattr(got.task, k) for k in change.changes} == dict(change.changes)
    finished = store.finish_send(before.id, at=LATER, message_id="<m@x>")
    assert finished.task is not None
    done = transitions.finish(got.task, LATER, "<m@x>")
    assert finished.task.state is done.new
    assert {k: getattr(finished.task, k) for k in done.changes} == dict(done.changes)


def test_the_claim_and_the_finish_return_a_later_steps_task_with_its_step(active: Store) -> None:
    store = active
    third = make_task("c1", 0, id=task_id("c1", 0, 3), step=3, token="tok-s3")
    assert store.insert_tasks([third], at=T0) == 1
    got = claim(store, third.id, third.token)
    assert got.claimed and got.task is not None
    assert (got.task.id, got.task.step, got.task.state) == ("c1-0-s3", 3, S.RUNNING)
    refused = claim(store, third.id, third.token)
    assert refused.refused is ClaimRefusal.NOT_PENDING
    assert refused.task is not None and refused.task.step == 3
    finished = store.finish_send(third.id, at=LATER, message_id="<m@x>")
    done = finished.task
    assert done is not None and (done.step, done.state) == (3, S.FINISHED)
    # Step 1 of the same recipient is its own task, untouched.
    first = store.get_task("c1-0")
    assert first is not None and (first.step, first.state) == (1, S.PENDING)


@pytest.mark.parametrize("undo", ["give_back", "unclaim", "retry_into"])
def test_a_claim_given_back_leaves_the_task_pending_with_no_claimed_at(
    active: Store, undo: str
) -> None:
    """Every store applies the claimed_at the named transitions clear when a claim is given
    back, undone or retried: a Pending task holds no claim, and its next claim stamps anew."""
    store = active
    before = store.get_task("c1-0")
    assert before is not None
    got = claim(store, before.id, before.token)
    assert got.task is not None and got.task.claimed_at == LATER
    change = {
        "give_back": lambda: transitions.give_back(got.task, "outside", undo_attempt=True),
        # read with a claimed_at an older version left on a Pending task: not restored
        "unclaim": lambda: transitions.unclaim(replace(before, claimed_at=T0), "moved"),
        "retry_into": lambda: transitions.retry_into(
            got.task, LATER, reason="transient: 421", note="retry", token="t2"
        ),
    }[undo]()
    back = apply_change(store, change, at=LATER)
    assert back is not None and store.get_task(before.id) == back
    assert (back.state, back.claimed_at) == (S.PENDING, None)
    again = LATER + timedelta(minutes=1)
    reclaimed = claim(store, before.id, back.token, at=again, due_by=again)
    assert reclaimed.task is not None and reclaimed.task.claimed_at == again


def test_each_refusal_says_why_and_writes_nothing(active: Store) -> None:
    store = active
    t0, t1, t2 = (store.get_task(f"c1-{i}") for i in range(3))
    assert t0 is not None and t1 is not None and t2 is not None
    before = [e for e in all_changes(store) if e.task_id is not None]
    assert claim(store, "nope").refused is ClaimRefusal.NOT_FOUND
    assert claim(store, t0.id, "other").refused is ClaimRefusal.STALE
    early = claim(store, t0.id, t0.token, due_by=t0.send_at - timedelta(seconds=1))
    assert early.refused is ClaimRefusal.EARLY and early.task == t0
    late = claim(store, t0.id, t0.token, not_before=t0.send_at + timedelta(seconds=1))
    assert late.refused is ClaimRefusal.LATE
    entry = Suppression("r1@example.com", SuppressionReason.BOUNCED, None, T0)
    store.suppress([entry])
    listed = claim(store, t1.id, t1.token)
    assert listed.refused is ClaimRefusal.SUPPRESSED and listed.suppression == entry
    store.set_campaign_state("c1", {CampaignState.ACTIVE}, CampaignState.PAUSED, at=T0)
    paused = claim(store, t2.id, t2.token)
    assert paused.refused is ClaimRefusal.NOT_SENDING
    assert paused.campaign_state is CampaignState.PAUSED
    assert [e for e in all_changes(store) if e.task_id is not None] == before
    assert all(store.get_task(t.id).state is S.PENDING for t in (t0, t1, t2))  # type: ignore[union-attr]


def _drop_campaign_keeping_its_tasks(backend: Backend, store: Any, cid: str) -> None:
    """Remove campaign ``cid`` behind the store's back, its tasks left: the orphan no port
    call makes (SQL cascades, memory refuses), as a half-done delete or a bad restore would."""
    if backend.name == "memory":
        del store._campaigns[cid]
    elif backend.name == "sqlite":  # a plain connection: foreign keys off, no cascade
        with sqlite3.connect(store.engine.url.database) as db:
            db.execute("DELETE FROM campaigns WHERE id = ?", (cid,))
    elif backend.name == "postgres":  # replica role: no foreign key trigger, no cascade
        with store.engine.begin() as db:
            db.exec_driver_sql("SET LOCAL session_replication_role = replica")
            db.exec_driver_sql("DELETE FROM campaigns WHERE id = %(id)s", {"id": cid})
    else:
        key = {"pk": {"S": "campaign"}, "sk": {"S": cid}}
        store._db.delete_item(TableName=store._table, Key=key)


def test_a_task_whose_campaign_is_missing_is_not_found(backend: Backend, active: Store) -> None:
    """Every store answers NOT_FOUND for a task whose campaign is gone (the SQL claim's join
    finds no row): the worker skips it as an unknown task, and nothing is written."""
    store = active
    task = store.get_task("c1-0")
    assert task is not None
    _drop_campaign_keeping_its_tasks(backend, store, "c1")
    got = claim(store, task.id, task.token)
    assert (got.refused, got.task, got.campaign_state) == (ClaimRefusal.NOT_FOUND, None, None)
    assert store.get_task(task.id) == task


def test_the_claim_reads_the_booking_and_the_finish_counts_it_sent(active: Store) -> None:
    store = active
    task = store.get_task("c1-0")
    assert task is not None
    store.add_sender(Sender(id="s1", email="anna@example.com"))
    day = task.send_at.date()
    store.book([Booking("s1", task.send_at, day, task.id, "c1", "r0@example.com", 50)])
    got = claim(store, task.id, task.token)
    assert got.claimed and got.booking_at == task.send_at
    done = store.finish_send(task.id, at=LATER, message_id="<m@x>", slot=task.send_at)
    assert done.settled and done.pending_left is not None
    assert done.task is not None and done.task.state is S.FINISHED
    assert (done.task.sent_at, done.task.message_id) == (LATER, "<m@x>")
    assert done.task.outcome is TaskOutcome.ACCEPTED
    assert [
        (d.planned, d.sent)
        for d in store.sender_usage("s1", since=day, until=day + timedelta(days=1))
    ] == [(0, 1)]
    assert store.mark_sent(task.id) is False  # counted once
    assert store.finish_send(task.id, at=LATER, message_id="<m@x>").task is None


def test_the_finish_of_a_booking_elsewhere_leaves_it_and_says_so(active: Store) -> None:
    store = active
    task = store.get_task("c1-0")
    assert task is not None
    store.add_sender(Sender(id="s1", email="anna@example.com"))
    moved = task.send_at + timedelta(minutes=30)
    store.book([Booking("s1", moved, moved.date(), task.id, "c1", "r0@example.com", 50)])
    got = claim(store, task.id, task.token)
    assert got.claimed and got.booking_at == moved
    done = store.finish_send(task.id, at=LATER, message_id="<m@x>", slot=task.send_at)
    assert done.task is not None and not done.settled
    assert store.mark_sent(task.id) is True  # still planned: the caller settles it


def test_the_finish_tells_whether_pending_tasks_are_left(active: Store) -> None:
    store = active
    ids = [f"c1-{i}" for i in range(3)]
    results = []
    for tid in ids:
        task = store.get_task(tid)
        assert task is not None and claim(store, tid, task.token).claimed
    for tid in ids:
        results.append(store.finish_send(tid, at=LATER, message_id=f"<{tid}>").pending_left)
    assert results[-1] is False  # nothing Pending is left after the last one


def test_of_concurrent_claims_of_one_task_exactly_one_wins(backend: Backend, active: Store) -> None:
    task = active.get_task("c1-1")
    assert task is not None
    handles = [backend.handle() for _ in range(4)]
    barrier = threading.Barrier(len(handles))
    results: list[SendClaim] = []
    lock = threading.Lock()

    def run(handle: Store) -> None:
        barrier.wait()
        got = claim(handle, task.id, task.token)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=run, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.claimed for r in results) == 1
    assert {r.refused for r in results if not r.claimed} <= {
        ClaimRefusal.NOT_PENDING,
        ClaimRefusal.TAKEN,
    }
    claims = [
        e for e in all_changes(active, "c1") if e.task_id == task.id and e.to_state == "Running"
    ]
    assert len(claims) == 1
