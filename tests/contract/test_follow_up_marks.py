"""The marks of sent steps whose next step is still to be made (``finish_send(follow_up=True)``,
``FollowUpMarks``) and the batched return dates (``FeedbackOutcomes.away_dates``), run against
every task store: memory, SQLite, PostgreSQL, DynamoDB on moto."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.ports import StoreBackend
from tests.contract.store_backends import T0, Backend, backend, with_tasks

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract

S = TaskState
LATER = T0 + timedelta(hours=1)

Store = StoreBackend


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


@pytest.fixture
def active(store: Store) -> Store:
    with_tasks(store, count=4)
    assert store.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0)
    provisioning = {CampaignState.PROVISIONING}
    assert store.set_campaign_state("c1", provisioning, CampaignState.ACTIVE, at=T0)
    return store


def send(store: Store, tid: str, *, follow_up: bool) -> None:
    task = store.get_task(tid)
    assert task is not None
    claim = store.claim_for_send(tid, token=task.token, at=LATER, due_by=LATER, not_before=T0)
    assert claim.claimed
    done = store.finish_send(tid, at=LATER, message_id=f"<{tid}@x>", follow_up=follow_up)
    assert done.task is not None and done.task.state is S.FINISHED


def test_a_finish_with_a_follow_up_is_marked_until_made(active: Store) -> None:
    store = active
    send(store, "c1-2", follow_up=True)
    send(store, "c1-0", follow_up=True)
    send(store, "c1-1", follow_up=False)
    due = store.follow_ups_due("c1")
    assert [t.id for t in due] == ["c1-0", "c1-2"]  # position order, the unmarked one left out
    assert all(t.state is S.FINISHED and t.outcome is TaskOutcome.ACCEPTED for t in due)
    assert [t.id for t in store.follow_ups_due("c1", limit=1)] == ["c1-0"]
    assert store.follow_ups_made("c1", ["c1-0", "c1-1", "nope"]) == 1
    assert [t.id for t in store.follow_ups_due("c1")] == ["c1-2"]
    assert store.follow_ups_made("c1", ["c1-0"]) == 0  # cleared twice: harmless
    assert store.follow_ups_due("unknown") == []


def test_a_mark_reads_the_task_as_it_is_now(active: Store) -> None:
    store = active
    send(store, "c1-0", follow_up=True)
    assert store.set_outcome("c1-0", TaskOutcome.REPLIED, detail="hi", at=LATER) is not None
    [due] = store.follow_ups_due("c1")
    assert due.outcome is TaskOutcome.REPLIED


def test_a_campaign_with_a_mark_is_not_done(active: Store) -> None:
    store = active
    for i in range(4):
        send(store, f"c1-{i}", follow_up=i == 3)
    assert store.has_unfinished_tasks("c1")  # every task Finished, one marked
    assert store.follow_ups_made("c1", ["c1-3"]) == 1
    assert not store.has_unfinished_tasks("c1")


def test_marks_of_one_campaign_are_its_own(active: Store) -> None:
    store = active
    with_tasks(store, "c2", count=1)
    assert store.set_campaign_state("c2", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0)
    assert store.set_campaign_state("c2", {CampaignState.PROVISIONING}, CampaignState.ACTIVE, at=T0)
    send(store, "c1-0", follow_up=True)
    send(store, "c2-0", follow_up=True)
    assert [t.id for t in store.follow_ups_due("c2")] == ["c2-0"]
    assert store.follow_ups_made("c2", ["c1-0"]) == 0  # another campaign's task: left alone
    assert [t.id for t in store.follow_ups_due("c1")] == ["c1-0"]


def test_away_dates_are_read_for_many_recipients_at_once(active: Store) -> None:
    store = active
    store.set_away("c1", 0, date(2026, 12, 14), at=T0)
    store.set_away("c1", 2, date(2026, 12, 20), at=T0)
    store.set_away("c1", 2, date(2026, 12, 21), at=LATER)  # the newest notice's
    assert store.away_dates("c1", [0, 1, 2, 7]) == {0: date(2026, 12, 14), 2: date(2026, 12, 21)}
    assert store.away_dates("c1", []) == {}
    assert store.away_dates("c2", [0]) == {}
