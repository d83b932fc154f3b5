"""The planner's grid as integer milliseconds (``planner._grid_ms``), which the capacity
planner walks: the same instants as :func:`plan` without jitter, each before its slot's window
end, across DST days (issue 13)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.planner import _grid_ms, plan
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.slots import in_policy
from tests.unit.test_capacity import instants, policies

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@settings(max_examples=150, deadline=None)
@given(policy=policies(), now=instants, count=st.integers(1, 300))
def test_the_ms_grid_is_plans_grid(policy: SendingPolicy, now: datetime, count: int) -> None:
    grid: list[int] = []
    ends: list[int] = []
    for base, day, first in _grid_ms(policy, now):
        grid.extend(base + s for s in day.slots[first:])
        ends.extend(base + e for e in day.ends[first:])
        if len(grid) >= count:
            break
    expected = plan(replace(policy, jitter_seconds=0), count, now=now)
    assert [_EPOCH + timedelta(milliseconds=ms) for ms in grid[:count]] == expected
    for ms, end in islice(zip(grid, ends, strict=True), count):
        assert ms < end
        # the last instant before the slot's window end is still inside the window
        assert in_policy(policy, _EPOCH + timedelta(milliseconds=end - 1))
