"""The TaskStore contract as a whole (sendqueue.ports.TaskStore: every aggregate of
:mod:`sendqueue.ports.tasks` together): datetimes, and what an unreachable backend raises, run
against every backend of :mod:`tests.contract.store_backends`.

Each aggregate's own contract is its module: ``test_campaigns``, ``test_tasks``,
``test_task_queries``, ``test_change_log``, ``test_leases``, ``test_counters``; the suppression
list, the feedback store, the sender store and the webhook store have theirs too.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from sendqueue.domain.errors import IllegalTransition, StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import Move, task_id
from sendqueue.ports import TaskStore
from tests.contract.store_backends import (
    T0,
    Backend,
    S,
    all_changes,
    backend,
    campaign,
    is_utc,
    make_task,
    recipients,
    store,
    with_tasks,
)

__all__ = ["backend", "store"]  # the fixtures: every backend's store


# --- time -------------------------------------------------------------------------------------


def test_datetimes_round_trip_as_aware_utc(store: TaskStore) -> None:
    plus_five_thirty = timezone(timedelta(hours=5, minutes=30))
    local = datetime(2026, 12, 1, 14, 45, 7, 123456, tzinfo=plus_five_thirty)
    store.create_campaign(campaign(created_at=local), [])
    store.insert_tasks([make_task("c1", 0, send_at=local)], at=local)
    store.transition(
        task_id("c1", 0), S.PENDING, S.RUNNING, at=local, changes={"claimed_at": local}
    )
    store.acquire_lease("l", "a", ttl_seconds=1, at=local)

    got_campaign = store.get_campaign("c1")
    task = store.get_task(task_id("c1", 0))
    assert task is not None
    values = [
        got_campaign.created_at,
        got_campaign.updated_at,
        task.send_at,
        task.claimed_at,
        task.created_at,
        task.updated_at,
        *(e.at for e in all_changes(store)),
    ]
    for value in values:
        assert value is not None
        assert is_utc(value), value
        assert value == local
        assert value.microsecond == 123456
    assert task.send_at == datetime(2026, 12, 1, 9, 15, 7, 123456, tzinfo=UTC)
    just_after = local + timedelta(microseconds=1)
    assert [t.id for t in store.due_tasks(S.RUNNING, before=just_after)] == [task.id]
    assert store.due_tasks(S.RUNNING, before=local) == []
    # The lease ends one second after ``local``, whatever zone the caller uses.
    lease_ends = datetime(2026, 12, 1, 9, 15, 8, 123456, tzinfo=UTC)
    assert not store.acquire_lease(
        "l", "b", ttl_seconds=1, at=lease_ends - timedelta(microseconds=1)
    )
    assert store.acquire_lease("l", "b", ttl_seconds=1, at=lease_ends)


def test_naive_datetimes_are_refused(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    naive = datetime(2026, 12, 1, 9, 0)
    with pytest.raises(ValueError, match="naive"):
        store.transition(task.id, S.PENDING, S.RUNNING, at=naive)
    with pytest.raises(ValueError, match="naive"):
        store.insert_tasks([make_task("c1", 1, send_at=naive)], at=T0)
    current = store.get_task(task.id)
    assert current is not None
    assert current.state is S.PENDING
    assert store.get_task(task_id("c1", 1)) is None


# --- failures ---------------------------------------------------------------------------------


def test_unreachable_backend_raises_store_unavailable(backend: Backend) -> None:
    store = backend.unreachable()
    calls: list[Callable[[], object]] = [
        lambda: store.create_campaign(campaign(), recipients(1)),
        lambda: store.get_campaign("c1"),
        lambda: store.list_campaigns(),
        lambda: store.set_campaign_state(
            "c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0
        ),
        lambda: store.save_checkpoint("c1", None, at=T0),
        lambda: store.list_recipients("c1"),
        lambda: store.insert_tasks([make_task("c1", 0)], at=T0),
        lambda: store.get_task("t"),
        lambda: store.get_tasks(["t"]),
        lambda: store.transition("t", S.PENDING, S.RUNNING, at=T0),
        lambda: store.transition_all("c1", S.PENDING, S.CANCELLED, at=T0),
        lambda: store.reschedule([Move("t", "x", T0, "y")], at=T0, reason="r"),
        lambda: store.booked("c1", since=T0),
        lambda: store.count_moves("c1", late_after=60),
        lambda: store.list_tasks("c1"),
        lambda: store.due_tasks(S.PENDING, before=T0),
        lambda: store.stale_running(claimed_before=T0),
        lambda: store.count_tasks("c1"),
        lambda: store.changes_after(0),
        lambda: store.last_change_id(),
        lambda: store.acquire_lease("l", "a", ttl_seconds=1, at=T0),
        lambda: store.release_lease("l", "a"),
        lambda: store.counter("c"),
        lambda: store.increment_counter("c"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()
    # The lifecycle is checked before the backend is touched.
    with pytest.raises(IllegalTransition):
        store.transition("t", S.FINISHED, S.PENDING, at=T0)
