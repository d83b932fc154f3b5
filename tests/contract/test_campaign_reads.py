"""The CampaignReads contract (sendqueue.ports.reads.CampaignReads), run against every task store.

The backends are the TaskStore contract's (:mod:`tests.contract.test_task_store`): memory,
SQLite, PostgreSQL and DynamoDB on moto. Each one-call view must say what the store's own
reads say: the counts, moves, suppressed tasks, outcomes, the next send, a page of tasks with
the senders it names, one task with its campaign and sender, and whether the campaign's change
log moved.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest

from sendqueue.domain.errors import InvalidField, NotFound, StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Move, TaskChanges, task_id
from sendqueue.domain.senders import Sender
from sendqueue.ports import StoreBackend
from tests.contract.store_backends import (
    T0,
    Backend,
    backend,
    campaign,
    drive,
    make_task,
    recipients,
)

S = TaskState
LATE = 60.0

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract


Store = StoreBackend


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


def _finish(store: Store, tid: str, *, late: bool, outcome: TaskOutcome) -> None:
    task = store.get_task(tid)
    assert task is not None
    at = task.send_at + timedelta(seconds=LATE * 2 if late else 1)
    drive(store, tid, S.RUNNING, at)
    changes: TaskChanges = {"sent_at": at, "message_id": f"<{tid}@x>", "outcome": outcome}
    changes["outcome_at"] = at
    assert store.transition(tid, S.RUNNING, S.FINISHED, at=at, changes=changes)


def _active_campaign(store: Store, cid: str = "c1") -> None:
    """Campaign ``cid`` (senders s1 and s2, s2 removed later) with 8 tasks: 0 sent on time
    (accepted), 1 sent late (bounced), 2 cancelled as suppressed, 3 failed, 4 moved, 5..7
    Pending; tasks 0-3 go out from s1, 5 from the removed s2."""
    store.add_sender(Sender(id="s1", email="anna@example.com", name="Anna"))
    store.add_sender(Sender(id="s2", email="bob@example.com"))
    store.create_campaign(campaign(cid, sender_ids=("s1", "s2")), recipients(8))
    anna: dict[str, Any] = {"sender_id": "s1", "sender": "anna@example.com"}
    tasks = [make_task(cid, i, **(anna if i < 4 else {})) for i in range(8)]
    tasks[2] = make_task(cid, 2, state=S.CANCELLED, reason="suppressed: bounced", **anna)
    tasks[5] = make_task(cid, 5, sender_id="s2", sender="bob@example.com")
    assert store.insert_tasks(tasks, at=T0) == 8
    store.remove_sender("s2")
    _finish(store, f"{cid}-0", late=False, outcome=TaskOutcome.ACCEPTED)
    _finish(store, f"{cid}-1", late=True, outcome=TaskOutcome.BOUNCED)
    drive(store, f"{cid}-3", S.FAILED, T0)
    moved = store.get_task(f"{cid}-4")
    assert moved is not None
    later = T0 + timedelta(days=1)
    assert store.reschedule([Move(moved.id, moved.token, later, "t4b")], at=T0, reason="retry")
    steps = [CampaignState.DRAFT, CampaignState.PROVISIONING, CampaignState.ACTIVE]
    for old, new in pairwise(steps):
        assert store.set_campaign_state(cid, [old], new, at=T0)


def test_campaign_figures_say_what_the_stores_own_reads_say(store: Store) -> None:
    _active_campaign(store)
    figures = store.campaign_figures("c1", late_after=LATE)
    assert figures.campaign == store.get_campaign("c1")
    assert figures.campaign.state is CampaignState.ACTIVE
    assert dict(figures.counts) == store.count_tasks("c1")
    assert figures.counts[S.PENDING] == 4
    assert (figures.moved, figures.late) == store.count_moves("c1", late_after=LATE) == (1, 1)
    assert figures.suppressed == store.count_suppressed_tasks("c1") == 1
    assert dict(figures.outcomes) == store.count_outcomes("c1")
    assert figures.outcomes[TaskOutcome.BOUNCED] == 1
    # the earliest Pending send: task 5 (task 4 was moved a day later)
    assert figures.next_send_at == T0 + timedelta(minutes=5)
    assert figures.changed is None


def test_a_campaign_not_sending_has_no_next_send(store: Store) -> None:
    store.create_campaign(campaign("c1"), recipients(2))
    store.insert_tasks([make_task("c1", 0), make_task("c1", 1)], at=T0)
    figures = store.campaign_figures("c1", late_after=LATE)
    assert figures.campaign.state is CampaignState.DRAFT
    assert figures.next_send_at is None
    assert figures.counts[S.PENDING] == 2


def test_all_campaign_figures_are_newest_first_each_with_its_own(store: Store) -> None:
    _active_campaign(store, "c1")
    store.create_campaign(campaign("c2", created_at=T0 + timedelta(hours=1)), recipients(1))
    found = store.all_campaign_figures(late_after=LATE)
    assert [f.campaign.id for f in found] == [c.id for c in store.list_campaigns()]
    assert [f.campaign.id for f in found] == ["c2", "c1"]
    assert found[1] == store.campaign_figures("c1", late_after=LATE)
    assert sum(found[0].counts.values()) == 0
    assert found[0].next_send_at is None


def test_a_task_listing_is_list_tasks_with_more_and_the_senders_named(store: Store) -> None:
    _active_campaign(store)
    first = store.task_listing("c1", limit=3)
    assert first.campaign == store.get_campaign("c1")
    assert list(first.tasks) == store.list_tasks("c1", limit=3)
    assert first.more is True
    # s1 by the campaign and the page; s2 is named by the campaign but was removed
    assert set(first.senders) == {"s1"}
    assert first.senders["s1"] == store.get_sender("s1")
    rest = store.task_listing("c1", after=first.tasks[-1].position, limit=5)
    assert [t.position for t in rest.tasks] == [3, 4, 5, 6, 7]
    assert rest.more is False
    pending = store.task_listing("c1", state=S.PENDING, search="R5@EXAMPLE")
    assert [t.id for t in pending.tasks] == ["c1-5"]
    assert pending.more is False


def test_a_listing_and_the_campaign_page_filter_by_step(store: Store) -> None:
    store.create_campaign(campaign("c1"), recipients(3))
    later = [make_task("c1", p, id=task_id("c1", p, 2), step=2) for p in (0, 2)]
    store.insert_tasks([make_task("c1", p) for p in range(3)] + later, at=T0)
    listing = store.task_listing("c1", step=2, limit=1)
    assert ([t.id for t in listing.tasks], listing.more) == (["c1-0-s2"], True)
    rest = store.task_listing("c1", step=2, after=0)
    assert ([t.id for t in rest.tasks], rest.more) == (["c1-2-s2"], False)
    assert [t.id for t in store.task_listing("c1", step=1).tasks] == ["c1-0", "c1-1", "c1-2"]
    page = store.campaign_page("c1", late_after=LATE, step=2)
    assert [t.id for t in page.listing.tasks] == ["c1-0-s2", "c1-2-s2"]
    assert page.figures.counts[S.PENDING] == 5
    with pytest.raises(InvalidField) as info:
        store.task_listing("c1", step=11)
    assert info.value.field == "step"


def test_a_listing_of_a_campaign_without_senders_reads_none(store: Store) -> None:
    store.create_campaign(campaign("c1"), recipients(1))
    store.insert_tasks([make_task("c1", 0)], at=T0)
    listing = store.task_listing("c1")
    assert ([t.id for t in listing.tasks], dict(listing.senders)) == (["c1-0"], {})
    assert store.task_listing("c1", limit=0).tasks == []


def test_a_task_detail_is_the_campaign_the_task_and_the_sender_it_names(store: Store) -> None:
    _active_campaign(store)
    sent = store.task_detail("c1", "c1-0")
    assert sent.campaign == store.get_campaign("c1")
    assert sent.task == store.get_task("c1-0")
    assert sent.task is not None and sent.task.state is S.FINISHED
    assert dict(sent.senders) == {"s1": store.get_sender("s1")}
    # task 5 names s2, removed since: the task alone names it, by address
    removed = store.task_detail("c1", "c1-5")
    assert removed.task == store.get_task("c1-5")
    assert dict(removed.senders) == {}
    # a task without a sender reads none
    store.create_campaign(campaign("c2"), recipients(1))
    store.insert_tasks([make_task("c2", 0)], at=T0)
    plain = store.task_detail("c2", "c2-0")
    assert (plain.task, dict(plain.senders)) == (store.get_task("c2-0"), {})


def test_a_task_detail_of_an_unknown_task_or_another_campaigns_has_none(store: Store) -> None:
    _active_campaign(store)
    store.create_campaign(campaign("c2"), recipients(1))
    store.insert_tasks([make_task("c2", 0)], at=T0)
    unknown = store.task_detail("c1", "nope")
    assert (unknown.campaign, unknown.task, dict(unknown.senders)) == (
        store.get_campaign("c1"),
        None,
        {},
    )
    other = store.task_detail("c2", "c1-0")
    assert (other.campaign.id, other.task, dict(other.senders)) == ("c2", None, {})


def test_the_campaign_page_reads_the_change_log_head_figures_and_a_listing(store: Store) -> None:
    _active_campaign(store)
    page = store.campaign_page("c1", late_after=LATE, state=S.PENDING, limit=2)
    assert page.last_change_id == store.last_change_id()
    assert page.figures == store.campaign_figures("c1", late_after=LATE)
    assert page.listing == store.task_listing("c1", state=S.PENDING, limit=2)
    assert [t.position for t in page.listing.tasks] == [4, 5]


def test_changes_since_says_whether_the_campaigns_log_moved(store: Store) -> None:
    _active_campaign(store)
    store.create_campaign(campaign("c2"), recipients(1))
    head = store.last_change_id()
    assert store.campaign_figures("c1", late_after=LATE, changes_since=head).changed is False
    # another campaign's change is not this one's
    store.insert_tasks([make_task("c2", 0)], at=T0)
    page = store.campaign_page("c1", late_after=LATE, changes_since=head)
    assert page.figures.changed is False
    drive(store, "c1-6", S.RUNNING, T0)
    assert store.campaign_figures("c1", late_after=LATE, changes_since=head).changed is True
    assert store.campaign_page("c1", late_after=LATE, changes_since=head).figures.changed


def test_an_unknown_campaign_or_a_bad_page_is_refused(store: Store) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.campaign_figures("nope", late_after=LATE),
        lambda: store.task_listing("nope"),
        lambda: store.campaign_page("nope", late_after=LATE),
        lambda: store.task_detail("nope", "nope-0"),
    ]
    for call in calls:
        with pytest.raises(NotFound) as unknown:
            call()
        assert unknown.value.kind == "campaign"
    store.create_campaign(campaign("c1"), recipients(1))
    with pytest.raises(InvalidField) as bad_limit:
        store.task_listing("c1", limit=-1)
    assert bad_limit.value.field == "limit"
    with pytest.raises(InvalidField) as bad_cursor:
        store.campaign_page("c1", late_after=LATE, after=-2)
    assert bad_cursor.value.field == "after"


def test_unreachable_backend_raises_store_unavailable(backend: Backend) -> None:
    store = backend.unreachable()
    calls: list[Callable[[], object]] = [
        lambda: store.campaign_figures("c1", late_after=LATE),
        lambda: store.all_campaign_figures(late_after=LATE),
        lambda: store.task_listing("c1"),
        lambda: store.campaign_page("c1", late_after=LATE),
        lambda: store.task_detail("c1", "c1-0"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()


def test_counts_per_step_split_states_and_outcomes_by_step(store: Store) -> None:
    _active_campaign(store)
    later = [make_task("c1", p, id=task_id("c1", p, 2), step=2) for p in (0, 1, 5)]
    later[2] = make_task(
        "c1", 5, id=task_id("c1", 5, 2), step=2, state=S.CANCELLED, reason="replied"
    )
    assert store.insert_tasks(later, at=T0) == 3
    _finish(store, task_id("c1", 0, 2), late=False, outcome=TaskOutcome.REPLIED)
    found = store.count_steps("c1")
    assert sorted(found) == [1, 2]
    first, second = found[1], found[2]
    assert first.counts == {S.PENDING: 4, S.RUNNING: 0, S.FINISHED: 2, S.FAILED: 1,
                            S.CANCELLED: 1}  # fmt: skip
    assert first.outcomes == {TaskOutcome.ACCEPTED: 1, TaskOutcome.BOUNCED: 1}
    assert second.counts == {S.PENDING: 1, S.RUNNING: 0, S.FINISHED: 1, S.FAILED: 0,
                             S.CANCELLED: 1}  # fmt: skip
    assert second.outcomes == {TaskOutcome.REPLIED: 1}
    # the steps add up to the campaign's own counts
    totals = store.count_tasks("c1")
    assert {s: first.counts[s] + second.counts[s] for s in S} == totals
    figures = store.campaign_figures("c1", late_after=LATE, steps=True)
    assert figures.steps == found
    assert store.campaign_page("c1", late_after=LATE, steps=True).figures.steps == found
    # only asked for: a listing of campaigns reads no steps
    assert store.campaign_figures("c1", late_after=LATE).steps is None
    assert store.all_campaign_figures(late_after=LATE)[0].steps is None


def test_counts_per_step_of_a_campaign_without_tasks_or_unknown_are_empty(store: Store) -> None:
    store.create_campaign(campaign("c1"), recipients(2))
    assert store.count_steps("c1") == {}
    assert store.count_steps("nope") == {}
