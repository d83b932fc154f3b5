"""SendingPolicy validation, the parse_* helpers, describe() and the JSON round trip."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.policy import (
    DEFAULT_WEEKDAYS,
    DEFAULT_WINDOWS,
    MAX_JITTER_SECONDS,
    MAX_PER_DAY,
    SendingPolicy,
    Window,
    load_timezone,
    parse_date,
    parse_start,
    parse_weekdays,
    parse_window,
)


def field_of(**kwargs: Any) -> str:
    with pytest.raises(InvalidField) as err:
        SendingPolicy(**kwargs)
    return err.value.field


# -- every invalid field names itself ----------------------------------------------------------


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", " UTC", "Europe/", "../etc/passwd", 5, None])
def test_bad_timezone(tz: object) -> None:
    assert field_of(timezone=tz) == "timezone"


@pytest.mark.parametrize("per_day", [0, -1, MAX_PER_DAY + 1, "20", 2.5, True, None])
def test_bad_per_day(per_day: object) -> None:
    assert field_of(per_day=per_day) == "per_day"


@pytest.mark.parametrize("per_day", [1, MAX_PER_DAY])
def test_per_day_bounds_are_inclusive(per_day: int) -> None:
    assert SendingPolicy(per_day=per_day).per_day == per_day


@pytest.mark.parametrize(
    "weekdays",
    [frozenset(), frozenset({7}), frozenset({-1}), "mon-fri", frozenset({True}), None, {0, "mon"}],
)
def test_bad_weekdays(weekdays: object) -> None:
    assert field_of(weekdays=weekdays) == "weekdays"


@pytest.mark.parametrize(
    "windows",
    [
        (),
        (Window(9 * 60, 12 * 60), Window(11 * 60, 13 * 60)),
        (Window(9 * 60, 17 * 60), Window(9 * 60, 17 * 60)),
        ("09:00-17:00",),
        "09:00-17:00",
        None,
    ],
)
def test_bad_windows(windows: object) -> None:
    assert field_of(windows=windows) == "windows"


def test_overlap_message_names_both_windows() -> None:
    with pytest.raises(InvalidField, match="overlap") as err:
        SendingPolicy(windows=(Window(13 * 60, 15 * 60), Window(9 * 60, 14 * 60)))
    assert err.value.value == "09:00-14:00, 13:00-15:00"


def test_adjacent_windows_are_allowed_and_sorted() -> None:
    policy = SendingPolicy(windows=(parse_window("12:00-17:00"), parse_window("09:00-12:00")))
    assert [str(w) for w in policy.windows] == ["09:00-12:00", "12:00-17:00"]


def test_window_crossing_midnight_suggests_two_windows() -> None:
    with pytest.raises(InvalidField) as err:
        parse_window("22:00-02:00")
    assert err.value.field == "windows"
    assert "22:00-24:00 and 00:00-02:00" in err.value.reason
    with pytest.raises(InvalidField) as err:
        Window(23 * 60, 60)
    assert "23:00-24:00 and 00:00-01:00" in err.value.reason


@pytest.mark.parametrize(("start", "end"), [(-1, 60), (0, 1441), (1440, 1440), (600, 600)])
def test_window_bounds(start: int, end: int) -> None:
    with pytest.raises(InvalidField) as err:
        Window(start, end)
    assert err.value.field == "windows"


@pytest.mark.parametrize("start", ["2026-01-01T09:00", date(2026, 1, 1), 1_700_000_000])
def test_bad_start(start: object) -> None:
    assert field_of(start=start) == "start"


def test_naive_start_is_wall_clock_time_in_the_policy_zone() -> None:
    policy = SendingPolicy(timezone="America/New_York", start=datetime(2026, 7, 1, 9, 0))
    assert policy.start is not None
    assert policy.start.tzinfo == ZoneInfo("America/New_York")
    assert policy.start.astimezone(UTC) == datetime(2026, 7, 1, 13, 0, tzinfo=UTC)


def test_aware_start_is_kept() -> None:
    start = datetime(2026, 7, 1, 9, 0, tzinfo=timezone(timedelta(hours=3)))
    assert SendingPolicy(start=start).start == start


@pytest.mark.parametrize(
    "skip_dates",
    [
        "2026-12-24",
        frozenset({"2026-12-24"}),
        frozenset({datetime(2026, 12, 24)}),
        frozenset({20261224}),
        42,
    ],
)
def test_bad_skip_dates(skip_dates: object) -> None:
    assert field_of(skip_dates=skip_dates) == "skip_dates"


def test_skip_dates_become_a_frozenset() -> None:
    policy = SendingPolicy(skip_dates=[date(2026, 12, 24), date(2026, 12, 24)])  # type: ignore[arg-type]
    assert policy.skip_dates == frozenset({date(2026, 12, 24)})


@pytest.mark.parametrize("jitter", [-1, MAX_JITTER_SECONDS + 1, 1.5, "60", True])
def test_bad_jitter(jitter: object) -> None:
    assert field_of(jitter_seconds=jitter) == "jitter_seconds"


@pytest.mark.parametrize("seed", ["x", 1.0, True, None])
def test_bad_seed(seed: object) -> None:
    assert field_of(seed=seed) == "seed"


def test_error_carries_field_value_and_reason() -> None:
    with pytest.raises(InvalidField) as err:
        SendingPolicy(per_day=0)
    assert err.value.value == 0
    assert "between 1 and 10000" in err.value.reason
    assert err.value.as_dict() == {"field": "per_day", "reason": err.value.reason, "value": 0}
    assert "per_day" in str(err.value)


def test_defaults() -> None:
    policy = SendingPolicy()
    assert policy.timezone == "Europe/Berlin"
    assert policy.per_day == 20
    assert policy.weekdays == DEFAULT_WEEKDAYS == frozenset(range(5))
    assert policy.windows == DEFAULT_WINDOWS
    assert policy.window_minutes == 480
    assert policy.start is None
    assert policy.zone == ZoneInfo("Europe/Berlin")


# -- parse helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("09:00-17:00", Window(540, 1020)),
        ("9:00-17:30", Window(540, 1050)),
        (" 00:00 - 24:00 ", Window(0, 1440)),
        ("23:59-24:00", Window(1439, 1440)),
    ],
)
def test_parse_window(text: str, expected: Window) -> None:
    assert parse_window(text) == expected
    assert parse_window(str(expected)) == expected


@pytest.mark.parametrize(
    "text", ["9-17", "09:00", "09:00-17:00-18:00", "25:00-26:00", "09:60-10:00", "24:00-24:00",
             "10:00-10:00", "", "ab:cd-ef:gh", "24:01-24:02"],
)  # fmt: skip
def test_parse_window_refuses(text: str) -> None:
    with pytest.raises(InvalidField) as err:
        parse_window(text)
    assert err.value.field == "windows"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mon-fri", {0, 1, 2, 3, 4}),
        ("sat-mon", {5, 6, 0}),
        ("Monday, wed,FRI", {0, 2, 4}),
        ("tues,thur", {1, 3}),
        ("sun-sun", {6}),
        ("mon-sun", set(range(7))),
        (["mon", " fri "], {0, 4}),
    ],
)
def test_parse_weekdays(text: str | list[str], expected: set[int]) -> None:
    assert parse_weekdays(text) == frozenset(expected)


@pytest.mark.parametrize("text", ["", ",", "mo", "funday", "mon-", "mon-xyz", []])
def test_parse_weekdays_refuses(text: str | list[str]) -> None:
    with pytest.raises(InvalidField) as err:
        parse_weekdays(text)
    assert err.value.field == "weekdays"


def test_parse_date() -> None:
    assert parse_date(" 2026-12-24 ") == date(2026, 12, 24)
    for bad in ["24.12.2026", "2026-02-30", ""]:
        with pytest.raises(InvalidField) as err:
            parse_date(bad)
        assert err.value.field == "skip_dates"
    with pytest.raises(InvalidField) as err:
        parse_date("x", "holiday")
    assert err.value.field == "holiday"


def test_parse_start() -> None:
    assert parse_start("2026-12-01T08:00Z", "Europe/Berlin") == datetime(2026, 12, 1, 8, tzinfo=UTC)
    assert parse_start("2026-12-01T09:00+01:00", "UTC") == datetime(2026, 12, 1, 8, tzinfo=UTC)
    local = parse_start("2026-12-01T09:00", "Europe/Berlin")
    assert local.tzinfo == ZoneInfo("Europe/Berlin")
    assert local.astimezone(UTC) == datetime(2026, 12, 1, 8, tzinfo=UTC)
    for bad in ["tomorrow", "2026-13-01", ""]:
        with pytest.raises(InvalidField) as err:
            parse_start(bad, "UTC")
        assert err.value.field == "start"
    with pytest.raises(InvalidField) as err:
        parse_start("2026-12-01T09:00", "Nowhere/Land")
    assert err.value.field == "timezone"


def test_load_timezone() -> None:
    assert load_timezone("Asia/Kathmandu") == ZoneInfo("Asia/Kathmandu")
    with pytest.raises(InvalidField) as err:
        load_timezone("Nowhere/Land", "default_timezone")
    assert err.value.field == "default_timezone"


# -- describe -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({}, "20 a day, Mon\u2013Fri, 09:00\u201317:00, Europe/Berlin"),
        (
            {"weekdays": frozenset(range(7)), "timezone": "UTC"},
            "20 a day, every day, 09:00\u201317:00, UTC",
        ),
        ({"weekdays": frozenset({0, 1})}, "20 a day, Mon, Tue, 09:00\u201317:00, Europe/Berlin"),
        (
            {"weekdays": frozenset({0, 2, 3, 4, 6})},
            "20 a day, Mon, Wed\u2013Fri, Sun, 09:00\u201317:00, Europe/Berlin",
        ),
        (
            {
                "per_day": 5,
                "windows": (Window(540, 720), Window(780, 1020)),
                "skip_dates": frozenset({date(2026, 12, 24), date(2026, 12, 25)}),
                "jitter_seconds": 90,
            },
            "5 a day, Mon\u2013Fri, 09:00\u201312:00 and 13:00\u201317:00, Europe/Berlin, "
            "skipping 2 dates, jitter \u00b190s",
        ),
    ],
)  # fmt: skip
def test_describe(kwargs: dict[str, Any], text: str) -> None:
    assert SendingPolicy(**kwargs).describe() == text


def test_describe_says_when_the_windows_are_each_recipients_local_time() -> None:
    policy = SendingPolicy(skip_dates=frozenset({date(2026, 12, 24)}))
    assert policy.describe(local_time=True) == (
        "20 a day, Mon\u2013Fri, 09:00\u201317:00 in each recipient's local time "
        "(Europe/Berlin where unknown; days counted in Europe/Berlin), skipping 1 date"
    )
    assert policy.describe(local_time=False) == policy.describe()


# -- JSON round trip ----------------------------------------------------------------------------

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]


@st.composite
def window_tuples(draw: st.DrawFn) -> tuple[Window, ...]:
    k = draw(st.integers(1, 3))
    points = sorted(
        draw(st.lists(st.integers(0, 1440), min_size=2 * k, max_size=2 * k, unique=True))
    )
    return tuple(Window(points[2 * i], points[2 * i + 1]) for i in range(k))


@st.composite
def starts(draw: st.DrawFn) -> datetime | None:
    kind = draw(st.sampled_from(["none", "naive", "utc", "zone", "offset"]))
    if kind == "none":
        return None
    naive = draw(st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1)))
    if kind == "naive":
        return naive
    if kind == "utc":
        return naive.replace(tzinfo=UTC)
    if kind == "zone":
        return naive.replace(tzinfo=ZoneInfo(draw(st.sampled_from(ZONES))))
    minutes = draw(st.integers(-14 * 60 + 1, 14 * 60 - 1))
    return naive.replace(tzinfo=timezone(timedelta(minutes=minutes)))


policies = st.builds(
    SendingPolicy,
    timezone=st.sampled_from(ZONES),
    per_day=st.integers(1, MAX_PER_DAY),
    weekdays=st.frozensets(st.integers(0, 6), min_size=1),
    windows=window_tuples(),
    start=starts(),
    skip_dates=st.frozensets(st.dates(date(2000, 1, 1), date(2100, 1, 1)), max_size=5),
    jitter_seconds=st.integers(0, MAX_JITTER_SECONDS),
    seed=st.integers(-(2**63), 2**63),
)


@settings(max_examples=300, deadline=None)
@given(policy=policies)
def test_to_dict_from_dict_round_trip(policy: SendingPolicy) -> None:
    data = json.loads(json.dumps(policy.to_dict()))
    back = SendingPolicy.from_dict(data)
    assert back.to_dict() == policy.to_dict()
    for name in ("timezone", "per_day", "weekdays", "windows", "skip_dates", "jitter_seconds",
                 "seed"):  # fmt: skip
        assert getattr(back, name) == getattr(policy, name)
    # the same instant; the tzinfo object may differ (the JSON form keeps only the offset)
    if policy.start is None:
        assert back.start is None
    else:
        assert back.start is not None
        assert back.start.astimezone(UTC) == policy.start.astimezone(UTC)
        assert back.start.utcoffset() == policy.start.utcoffset()
    assert back.describe() == policy.describe()


def test_from_dict_accepts_the_cli_forms() -> None:
    policy = SendingPolicy.from_dict(
        {
            "timezone": "America/New_York",
            "per_day": 50,
            "weekdays": "mon-wed",
            "windows": "08:00-12:00",
            "start": "2026-12-01T09:00",
            "skip_dates": ["2026-12-02", date(2026, 12, 3)],
            "jitter_seconds": 30,
            "seed": 7,
        }
    )
    assert policy.weekdays == frozenset({0, 1, 2})
    assert policy.windows == (Window(480, 720),)
    assert policy.start == datetime(2026, 12, 1, 9, tzinfo=ZoneInfo("America/New_York"))
    assert policy.skip_dates == frozenset({date(2026, 12, 2), date(2026, 12, 3)})
    assert SendingPolicy.from_dict({}) == SendingPolicy()
    assert SendingPolicy.from_dict({"timezone": None, "start": None}) == SendingPolicy()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"per_dy": 5}, "per_dy"),
        ({"per_day": "many"}, "per_day"),
        ({"weekdays": "someday"}, "weekdays"),
        ({"windows": ["09:00-17:00", "16:00-18:00"]}, "windows"),
        ({"windows": "17:00-09:00"}, "windows"),
        ({"start": "soon"}, "start"),
        ({"skip_dates": ["2026-02-30"]}, "skip_dates"),
        ({"timezone": "Atlantis/Capital"}, "timezone"),
        ({"jitter_seconds": -5}, "jitter_seconds"),
    ],
)
def test_from_dict_errors_name_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidField) as err:
        SendingPolicy.from_dict(data)
    assert err.value.field == field
