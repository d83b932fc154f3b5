"""SENDQUEUE_MAX_LATENESS has no upper bound (Settings: ge=0): a huge value, or inf, means
"never too late" for the send claim, as it always did, never an overflow on every send."""

from __future__ import annotations

import pytest

from sendqueue.domain.lifecycle import TaskState
from sendqueue.testing.clock import FakeClock
from tests.support.app import T0, fake_app
from tests.unit.test_worker import _fire_all, _provisioned, _tasks


@pytest.mark.parametrize("lateness", [1e12, float("inf")])
def test_a_huge_max_lateness_still_sends(lateness: float) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, max_lateness=lateness)
    cid = _provisioned(app, 2)
    clock.advance(hours=1)
    _fire_all(app)
    assert [t.state for t in _tasks(app, cid)] == [TaskState.FINISHED] * 2
