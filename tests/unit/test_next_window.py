"""next_window_instant: retries and recovered sends never go out outside the windows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.planner import next_window_instant
from sendqueue.domain.policy import SendingPolicy, Window

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]


def _inside(policy: SendingPolicy, instant: datetime) -> bool:
    local = instant.astimezone(policy.zone)
    if local.weekday() not in policy.weekdays or local.date() in policy.skip_dates:
        return False
    minute = local.hour * 60 + local.minute + local.second / 60 + local.microsecond / 6e7
    return any(w.start_minute <= minute < w.end_minute for w in policy.windows)


def test_examples() -> None:
    berlin = SendingPolicy(windows=(Window(540, 720), Window(780, 1020)))
    cases = {
        "2026-12-01T11:30:00+00:00": "2026-12-01T12:00:00+00:00",  # 12:30 lunch -> 13:00
        "2026-12-01T09:00:00+00:00": "2026-12-01T09:00:00+00:00",  # 10:00 inside
        "2026-12-04T16:00:00+00:00": "2026-12-07T08:00:00+00:00",  # Friday 17:00 -> Monday
        "2026-03-28T23:30:00+00:00": "2026-03-30T07:00:00+00:00",  # Sun (DST) -> Mon 09:00
    }
    for at, expected in cases.items():
        got = next_window_instant(berlin, datetime.fromisoformat(at))
        assert got == datetime.fromisoformat(expected), at


@settings(max_examples=300, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    start=st.integers(0, 23 * 60),
    length=st.integers(1, 8 * 60),
    weekdays=st.frozensets(st.integers(0, 6), min_size=1),
    at=st.datetimes(datetime(2026, 1, 1), datetime(2027, 12, 31), timezones=st.just(UTC)),
)
def test_result_is_the_first_instant_inside_a_window(
    zone: str, start: int, length: int, weekdays: frozenset[int], at: datetime
) -> None:
    policy = SendingPolicy(
        timezone=zone, weekdays=weekdays, windows=(Window(start, min(1440, start + length)),)
    )
    got = next_window_instant(policy, at)
    assert got >= at - timedelta(milliseconds=1)
    assert _inside(policy, got)
    if _inside(policy, at):
        assert got - at < timedelta(milliseconds=1)
    else:
        # nothing earlier qualifies: one millisecond before is outside (or before ``at``)
        before = got - timedelta(milliseconds=1)
        assert before < at or not _inside(policy, before)
