"""When making a batch of next steps fails: one recipient's step the store refuses does not
hold up the others; a step that cannot be made is recorded Cancelled with the error; a step
that cannot even be recorded keeps its mark; another process's lease leaves the marks to it;
a cancelled campaign's marks are dropped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task
from sendqueue.services.sequences import batch
from tests.unit.test_follow_up_batches import _marked_app, _tasks


def _refusing(app: Container, *, cancelled_too: bool) -> Callable[..., int]:
    """An ``insert_tasks`` that refuses recipient 0's step 2 (as DynamoDB refuses an item
    over 400 KB), also as a Cancelled task with ``cancelled_too``."""
    insert = app.store.insert_tasks

    def refusing(tasks: Sequence[Task], *, at: datetime) -> int:
        for t in tasks:
            if (t.position, t.step) == (0, 2) and (cancelled_too or t.state is TaskState.PENDING):
                raise InvalidField("task", t.id, "larger than a DynamoDB item can be (400 KB)")
        return insert(tasks, at=at)

    return refusing


def test_a_step_the_store_refuses_is_cancelled_and_the_others_are_made() -> None:
    app, clock, cid = _marked_app(5)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(app.store, "insert_tasks", _refusing(app, cancelled_too=False))
        assert app.followups.make_due(cid, now=clock.now()) == 4
    made = _tasks(app, cid, 2)
    assert sorted(p for p, t in made.items() if t.state is TaskState.PENDING) == [1, 2, 3, 4]
    refused = made[0]
    assert refused.state is TaskState.CANCELLED
    assert refused.reason is not None and "step 2 could not be made" in refused.reason
    assert "400 KB" in refused.reason
    assert app.store.follow_ups_due(cid) == []  # every mark cleared: the sequence ended there


def test_a_step_that_cannot_even_be_recorded_keeps_its_mark_and_not_the_others() -> None:
    app, clock, cid = _marked_app(5)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(app.store, "insert_tasks", _refusing(app, cancelled_too=True))
        for _ in range(2):  # the runner's pass, then the reconciler's: the same each time
            app.followups.make_due(cid, now=clock.now())
    assert sorted(_tasks(app, cid, 2)) == [1, 2, 3, 4]
    assert [t.position for t in app.store.follow_ups_due(cid)] == [0]
    assert app.store.has_unfinished_tasks(cid)  # not done while a step waits to be made
    # the store takes it again: the next pass makes it
    assert app.followups.make_due(cid, now=clock.now()) == 1
    assert sorted(_tasks(app, cid, 2)) == [0, 1, 2, 3, 4]
    assert app.store.follow_ups_due(cid) == []


def test_marks_are_left_to_the_process_holding_the_campaigns_lease() -> None:
    app, clock, cid = _marked_app(3)
    name = f"replan:{cid}"
    assert app.store.acquire_lease(name, "another-process", ttl_seconds=600, at=clock.now())
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(batch, "RETRY_LEASE_WAIT", 0.05)
        assert app.followups.make_due(cid, now=clock.now()) == 0
    assert _tasks(app, cid, 2) == {}
    assert len(app.store.follow_ups_due(cid)) == 3  # kept for the holder (or a later pass)
    app.store.release_lease(name, "another-process")
    assert app.followups.make_due(cid, now=clock.now()) == 3


def test_the_reconciler_drops_the_marks_of_a_cancelled_campaign() -> None:
    app, clock, cid = _marked_app(3)
    app.campaign_controls.cancel(cid)
    clock.advance(minutes=6)
    app.reconciler.run()
    assert app.store.follow_ups_due(cid) == []
    assert _tasks(app, cid, 2) == {}
