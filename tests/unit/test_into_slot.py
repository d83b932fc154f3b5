"""``into_slot``: how far a send time lies into its firing slot, which the worker forgives as
"not early" on a layer that fires anywhere within the slot (EventBridge's minute)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from sendqueue.domain.slots import into_slot

T = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)


def test_an_exact_layer_forgives_nothing() -> None:
    assert into_slot(T + timedelta(seconds=42), 0.0) == timedelta(0)


def test_a_minute_layer_forgives_the_time_since_the_minute_began() -> None:
    assert into_slot(T, 60.0) == timedelta(0)
    assert into_slot(T + timedelta(seconds=59, microseconds=5), 60.0) == timedelta(
        seconds=59, microseconds=5
    )


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from([1.0, 60.0, 0.5]))
def test_the_slot_start_is_never_after_the_send_and_within_one_slot(
    micros: int, precision: float
) -> None:
    at = T + timedelta(microseconds=micros)
    offset = into_slot(at, precision)
    assert timedelta(0) <= offset < timedelta(seconds=precision)
    assert into_slot(at - offset, precision) == timedelta(0)
