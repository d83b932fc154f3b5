"""The claim's ``due_by`` bound is exactly the worker's "not invoked before its firing slot"
rule: send_at <= due_by(now) if and only if send_at - now <= EARLY_TOLERANCE + into_slot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from sendqueue.domain.slots import into_slot
from sendqueue.services.sending.worker import EARLY_TOLERANCE, due_by

BASE = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
instants = st.integers(min_value=0, max_value=10**10).map(
    lambda us: BASE + timedelta(microseconds=us)
)


@given(now=instants, send_at=instants, precision=st.sampled_from([0.0, 0.5, 1.0, 60.0, 61.5]))
def test_due_by_is_the_early_rule(now: datetime, send_at: datetime, precision: float) -> None:
    early = send_at - now > EARLY_TOLERANCE + into_slot(send_at, precision)
    assert (send_at <= due_by(now, precision)) is not early


def test_the_edges_of_a_minute_slot() -> None:
    now = datetime(2026, 12, 1, 8, 0, 59, tzinfo=UTC)  # + 1 s tolerance: 08:01:00's slot
    assert due_by(now, 60.0) == datetime(2026, 12, 1, 8, 1, 59, 999999, tzinfo=UTC)
    assert due_by(now, 0.0) == datetime(2026, 12, 1, 8, 1, 0, tzinfo=UTC)
