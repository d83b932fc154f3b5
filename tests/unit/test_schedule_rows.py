"""The embedded scheduler's bulk rows, built from the checked bulk items (``rules.
check_due_many``: an instant each), must be the rows ``create`` stores for the Schedule of that
instant's wall time, due at exactly that instant (folds and gaps included); and ``due_at``, which
``create`` takes the instant from, must hold its rules around every kind of clock change."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.embedded.store import (
    due_params,
    insert_params,
    payload_json,
    payload_text,
    to_us,
)

_names = st.from_regex(r"[0-9a-zA-Z_.\-]{1,64}", fullmatch=True)
_tokens = st.from_regex(r"[a-zA-Z0-9_\-]{1,64}", fullmatch=True)
_zones = st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"])
_utc = st.just(UTC)
_payloads = st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=6)


@given(_payloads)
def test_payload_text_is_the_sorted_json_of_the_payload(payload: dict[str, str]) -> None:
    assert payload_text(payload) == payload_json(payload) == json.dumps(payload, sort_keys=True)
    assert json.loads(payload_text(payload)) == payload


@given(
    _names,
    _names,
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=_utc),
    st.sampled_from(
        ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC", "Europe/Dublin"]
    ),
    _payloads,
    _tokens,
    st.integers(0, rules.MAX_RETRIES_LIMIT),
)
@example("n", "g", datetime(2027, 10, 31, 1, 30, tzinfo=UTC), "Europe/Berlin", {}, "t", 2)
@example("n", "g", datetime(2027, 11, 7, 6, 30, tzinfo=UTC), "America/New_York", {}, "t", 2)
def test_a_bulk_row_is_the_row_of_the_schedule_create_builds_from_its_wall_time(
    name: str,
    group: str,
    instant: datetime,
    timezone: str,
    payload: dict[str, str],
    token: str,
    retries: int,
) -> None:
    """The second pass of a repeated hour (the examples) keeps its fold from the instant, so
    ``create`` of the wall time is due at the same instant."""
    now = datetime(2026, 12, 3, 14, 0, 0, 123456, tzinfo=UTC)
    (checked,) = rules.check_due_many([(name, group, instant, timezone, payload, token, retries)])
    wall = rules.wall_time(instant.astimezone(ZoneInfo(timezone)))
    schedule = rules.build_schedule(
        name, group, wall, timezone, payload, token, retries, created_at=now
    )
    assert due_params(checked, to_us(now)) == insert_params(schedule)
    assert checked[-1] == schedule.due_at == instant
    (built,) = rules.build_due_schedules(
        [(name, group, instant, timezone, payload, token, retries)], created_at=now
    )
    assert built == schedule


_ZONES_WITH_ODD_TRANSITIONS = st.sampled_from(
    [
        "Europe/Berlin",  # one hour, at 02:00 / 03:00 local
        "America/New_York",
        "Australia/Lord_Howe",  # half an hour
        "Europe/Dublin",  # negative DST in the database
        "Pacific/Apia",  # skipped 2011-12-30 whole: a 24-hour gap
        "Asia/Kathmandu",  # +05:45
    ]
)


def _transition_near(zone: str) -> st.SearchStrategy[datetime]:
    """Wall times spread over the years, weighted towards the hours around midnight to 04:00
    where the transitions fall."""
    return st.builds(
        lambda day, minutes, micro, fold: (
            datetime.combine(day, datetime.min.time())
            + timedelta(minutes=minutes, microseconds=micro)
        ).replace(fold=fold),
        st.dates(min_value=date(2005, 1, 1), max_value=date(2040, 12, 31)),
        st.one_of(st.integers(0, 24 * 60 - 1), st.integers(60, 4 * 60)),
        st.integers(0, 999_999),
        st.sampled_from([0, 1]),
    )


@settings(max_examples=400)
@example(("Europe/Berlin", datetime(2027, 3, 28, 2, 30)))  # in the gap
@example(("Europe/Berlin", datetime(2027, 3, 28, 2, 30, fold=1)))  # in the gap, marked fold=1
@example(("Europe/Dublin", datetime(2016, 3, 27, 1, 0, fold=1)))  # the gap's first instant
@example(("Europe/Berlin", datetime(2027, 10, 31, 2, 30)))  # shown twice
@example(("Europe/Berlin", datetime(2027, 10, 31, 2, 30, fold=1)))  # its second showing
@example(("Australia/Lord_Howe", datetime(2027, 10, 3, 2, 10)))  # a half-hour gap
@example(("Australia/Lord_Howe", datetime(2027, 4, 4, 1, 45)))  # a half hour shown twice
@example(("Pacific/Apia", datetime(2011, 12, 30, 12, 0)))  # the day skipped
@example(("Europe/Dublin", datetime(2027, 10, 31, 1, 30)))  # negative DST: shown twice
@given(_ZONES_WITH_ODD_TRANSITIONS.flatmap(lambda z: st.tuples(st.just(z), _transition_near(z))))
def test_due_at_is_the_instant_showing_the_wall_time_or_the_end_of_its_gap(
    case: tuple[str, datetime],
) -> None:
    name, wall = case
    zone = ZoneInfo(name)
    due = rules.due_at(wall, name)
    assert due.tzinfo is UTC
    readings = {wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)}
    shown = sorted(r for r in readings if r.astimezone(zone).replace(tzinfo=None) == wall)
    if shown:
        # A repeated wall time: its first occurrence, or its second when marked fold=1.
        assert due == shown[1 if wall.fold and len(shown) == 2 else 0]
    else:
        # Skipped by the clocks: the first instant after the gap, later on the wall than asked,
        # with the instant just before it still on the old offset.
        assert due.astimezone(zone).replace(tzinfo=None) > wall
        before = (due - timedelta(seconds=1)).astimezone(zone)
        assert before.utcoffset() != due.astimezone(zone).utcoffset()
        assert before.replace(tzinfo=None) < wall
