"""Sequence steps: delays, the steps' own checks, the Re: subject, the thread headers, and
when a later step is due (follow_up_earliest)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.steps import (
    MAX_STEPS,
    Delay,
    DelayUnit,
    Step,
    check_steps,
    follow_up_subject,
    parse_delay,
    thread_headers,
)

DAYS, HOURS, MINUTES = DelayUnit.DAYS, DelayUnit.HOURS, DelayUnit.MINUTES
EVERY_DAY = frozenset(range(7))
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def field_of(exc: pytest.ExceptionInfo[InvalidField]) -> str:
    return exc.value.field


# --- delays -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "amount", "unit"),
    [
        ("3d", 3, DAYS),
        ("4h", 4, HOURS),
        ("30m", 30, MINUTES),
        ("  3 D ", 3, DAYS),
        ("\t12H\n", 12, HOURS),
        ("007m", 7, MINUTES),
        ("60d", 60, DAYS),
        ("1440h", 1440, HOURS),
        ("86400m", 86400, MINUTES),
    ],
)
def test_parse_delay_reads_the_three_units(text: str, amount: int, unit: DelayUnit) -> None:
    delay = parse_delay(text)
    assert delay == Delay(amount, unit)
    assert parse_delay(delay.text) == delay
    assert delay.text == f"{amount}{unit.value[0]}"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0d", "at least 1"),
        ("0m", "at least 1"),
        ("-3d", "positive"),
        ("\u22123h", "positive"),
        ("3", "give a unit"),
        ("3w", "expected a delay"),
        ("3d4h", "expected a delay"),
        ("d", "expected a delay"),
        ("", "expected a delay"),
        ("1.5d", "expected a delay"),
        ("\u0663d", "expected a delay"),  # an Arabic-Indic 3: digits are ASCII only
        ("61d", "at most 60 sending days"),
        ("1441h", "at most 1440 hours"),
        ("86401m", "at most 86400 minutes"),
        ("9" * 5000 + "d", "at most 60 sending days"),
    ],
)
def test_parse_delay_refuses_naming_the_field(text: str, reason: str) -> None:
    with pytest.raises(InvalidField) as exc:
        parse_delay(text, "steps[2].after")
    assert field_of(exc) == "steps[2].after"
    assert reason in exc.value.reason


@pytest.mark.parametrize("value", [3, 3.0, None, True, ["3d"]])
def test_parse_delay_wants_text(value: object) -> None:
    with pytest.raises(InvalidField, match=r"steps\[3\]\.after") as exc:
        parse_delay(value, "steps[3].after")
    assert "written as text" in exc.value.reason


def test_delay_checks_what_it_is_built_from() -> None:
    for amount in (0, -1, 61, True, 2.0):
        with pytest.raises(InvalidField) as exc:
            Delay(amount, DAYS)  # type: ignore[arg-type]
        assert field_of(exc) == "after"
    with pytest.raises(InvalidField):
        Delay(3, "d")  # type: ignore[arg-type]
    assert Delay(61, HOURS).elapsed == timedelta(hours=61)
    assert Delay(90, MINUTES).elapsed == timedelta(minutes=90)
    assert Delay(3, DAYS).elapsed is None
    assert str(Delay(3, DAYS)) == "3d"


@given(
    unit=st.sampled_from(list(DelayUnit)),
    amount=st.integers(1, 86_400),
    left=st.sampled_from(["", " ", "\t"]),
    right=st.sampled_from(["", " ", "\n"]),
    upper=st.booleans(),
)
def test_delay_text_round_trips(
    unit: DelayUnit, amount: int, left: str, right: str, upper: bool
) -> None:
    most = {DAYS: 60, HOURS: 1440, MINUTES: 86_400}[unit]
    letter = unit.value[0].upper() if upper else unit.value[0]
    text = f"{left}{amount}{letter}{right}"
    if amount > most:
        with pytest.raises(InvalidField):
            parse_delay(text)
        return
    delay = parse_delay(text)
    assert (delay.amount, delay.unit) == (amount, unit)
    assert parse_delay(delay.text) == delay


# --- steps ------------------------------------------------------------------------------------


def step(
    number: int,
    *,
    subject: str | None = None,
    after: str | None = "1d",
    new_thread: bool = False,
    html: str | None = None,
) -> Step:
    delay = parse_delay(after) if after else None
    return Step(number, subject, f"body {number}", html, delay, new_thread)


def first() -> Step:
    return step(1, subject="Hello {{ name }}", after=None)


def test_a_valid_sequence_comes_back_as_a_tuple() -> None:
    steps = [first(), step(2, after="3d"), step(3, subject="Last call", after="4h")]
    assert check_steps(steps) == tuple(steps)
    assert check_steps([first()]) == (first(),)
    longest = [first(), *(step(k) for k in range(2, MAX_STEPS + 1))]
    assert len(check_steps(longest)) == MAX_STEPS


@pytest.mark.parametrize(
    ("steps", "field", "reason"),
    [
        ([], "steps", "1 to 10 steps"),
        ([first(), *(step(k) for k in range(2, MAX_STEPS + 2))], "steps", "1 to 10 steps"),
        ([first(), step(3)], "steps[2].number", "numbered 1 to 2"),
        ([step(2), first()], "steps[1].number", "numbered"),
        ([first(), step(2, after=None)], "steps[2].after", "wait after the previous step"),
        ([step(1, after=None)], "steps[1].subject", "step 1 needs a subject"),
        ([step(1, subject="Hi", after="1d")], "steps[1].after", "no delay"),
        ([step(1, subject="Hi", after=None, new_thread=True)], "steps[1].new_thread", "starts"),
        ([first(), "step 2"], "steps[2]", "expected a Step"),
    ],
)
def test_check_steps_names_the_step_and_field(steps: list[Step], field: str, reason: str) -> None:
    with pytest.raises(InvalidField) as exc:
        check_steps(steps)
    assert field_of(exc) == field
    assert reason in exc.value.reason


def test_check_steps_wants_a_list() -> None:
    for value in ("steps", None, {1: first()}):
        with pytest.raises(InvalidField) as exc:
            check_steps(value)  # type: ignore[arg-type]
        assert field_of(exc) == "steps"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"number": 0}, "steps.number"),
        ({"number": True}, "steps.number"),
        ({"subject": "  "}, "steps[2].subject"),
        ({"subject": 7}, "steps[2].subject"),
        ({"text": ""}, "steps[2].text"),
        ({"text": None}, "steps[2].text"),
        ({"html": "\n"}, "steps[2].html"),
        ({"after": "3d"}, "steps[2].after"),
        ({"new_thread": "yes"}, "steps[2].new_thread"),
    ],
)
def test_a_step_checks_its_own_fields(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {
        "number": 2,
        "subject": None,
        "text": "Hi again",
        "html": None,
        "after": Delay(1, DAYS),
        "new_thread": False,
    }
    values.update(kwargs)
    with pytest.raises(InvalidField) as exc:
        Step(**values)  # type: ignore[arg-type]
    assert field_of(exc) == field


# --- the Re: subject and the thread headers ---------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("Hello", "Re: Hello"),
        ("  Hello {{ name }} ", "Re: Hello {{ name }}"),
        ("Re: Hello", "Re: Hello"),
        ("RE: Hello", "RE: Hello"),
        ("re: Hello", "re: Hello"),
        ("Re:Hello", "Re:Hello"),
        ("Re : Hello", "Re : Hello"),
        ("Reminder: we met", "Re: Reminder: we met"),
        ("Regards", "Re: Regards"),
        ("Fwd: Re: x", "Re: Fwd: Re: x"),
    ],
)
def test_follow_up_subject(subject: str, expected: str) -> None:
    assert follow_up_subject(subject) == expected


@pytest.mark.parametrize("subject", ["", "   ", None])
def test_follow_up_subject_needs_a_subject(subject: str) -> None:
    with pytest.raises(InvalidField) as exc:
        follow_up_subject(subject)
    assert field_of(exc) == "subject"


def test_thread_headers_reply_to_the_last_and_reference_all_in_order() -> None:
    ids = ["<a1@mail.example>", "<b.2@mail.example>", "<c-3@[10.0.0.1]>"]
    assert thread_headers(ids) == {
        "In-Reply-To": "<c-3@[10.0.0.1]>",
        "References": "<a1@mail.example> <b.2@mail.example> <c-3@[10.0.0.1]>",
    }
    assert thread_headers(ids[:1]) == {
        "In-Reply-To": "<a1@mail.example>",
        "References": "<a1@mail.example>",
    }


@pytest.mark.parametrize(
    ("ids", "field"),
    [
        ([], "message_ids"),
        ("<a@b>", "message_ids"),
        (["a@b"], "message_ids[1]"),
        (["<a@b>", "<ab>"], "message_ids[2]"),
        (["<a@b>", "<a@b>\r\nBcc: x@y"], "message_ids[2]"),
        (["<a b@c>"], "message_ids[1]"),
        (["<@b>"], "message_ids[1]"),
        (["<a@>"], "message_ids[1]"),
        (["<<a@b>>"], "message_ids[1]"),
        (["<a@b> <c@d>"], "message_ids[1]"),
        (["<\u00e9@b>"], "message_ids[1]"),
        ([None], "message_ids[1]"),
    ],
)
def test_thread_headers_refuse_what_is_not_a_message_id(ids: list[str], field: str) -> None:
    with pytest.raises(InvalidField) as exc:
        thread_headers(ids)
    assert field_of(exc) == field


# --- when a later step is due: examples -------------------------------------------------------

BERLIN = SendingPolicy(timezone="Europe/Berlin")  # Mon-Fri 09:00-17:00
TWO_WINDOWS = SendingPolicy(timezone="Europe/Berlin", windows=(Window(600, 720), Window(840, 960)))


@pytest.mark.parametrize(
    ("policy", "sent", "after", "due"),
    [
        # Friday +1d -> Monday's first window (09:00 CET = 08:00Z), wherever in Friday
        (BERLIN, "2026-12-04T10:00+01:00", "1d", "2026-12-07T08:00Z"),
        (BERLIN, "2026-12-04T23:59+01:00", "1d", "2026-12-07T08:00Z"),
        (BERLIN, "2026-12-04T00:00+01:00", "2d", "2026-12-08T08:00Z"),
        # after the day's last window still counts from that day
        (BERLIN, "2026-12-01T18:30+01:00", "1d", "2026-12-02T08:00Z"),
        # the local date counts, not the UTC one: 23:30Z Thursday is Friday in Berlin
        (BERLIN, "2026-12-03T23:30Z", "1d", "2026-12-07T08:00Z"),
        # a weekend send counts from its own day: Saturday +1d is Monday
        (BERLIN, "2026-12-05T12:00+01:00", "1d", "2026-12-07T08:00Z"),
        (BERLIN, "2026-12-01T10:00+01:00", "5d", "2026-12-08T08:00Z"),
        # two windows: the first one's start
        (TWO_WINDOWS, "2026-12-01T15:00+01:00", "1d", "2026-12-02T09:00Z"),
        # elapsed time inside a window: that instant itself
        (BERLIN, "2026-12-01T10:00+01:00", "30m", "2026-12-01T09:30Z"),
        (BERLIN, "2026-12-01T10:00:00.2504+01:00", "30m", "2026-12-01T09:30:00.251Z"),
        # a window's start is inside it, its end is not
        (BERLIN, "2026-12-01T08:00+01:00", "1h", "2026-12-01T08:00Z"),
        (BERLIN, "2026-12-01T16:00+01:00", "1h", "2026-12-02T08:00Z"),
        # elapsed time crossing the night or the weekend: the next window's start
        (BERLIN, "2026-12-01T16:00+01:00", "4h", "2026-12-02T08:00Z"),
        (BERLIN, "2026-12-04T16:30+01:00", "1h", "2026-12-07T08:00Z"),
        # ... or the lunch break of two windows
        (TWO_WINDOWS, "2026-12-01T11:30+01:00", "45m", "2026-12-01T13:00Z"),
        (BERLIN, "2026-12-01T10:00+01:00", "48h", "2026-12-03T09:00Z"),
    ],
)
def test_follow_up_examples(policy: SendingPolicy, sent: str, after: str, due: str) -> None:
    got = follow_up_earliest(policy, at(sent), parse_delay(after))
    assert got == at(due)
    assert got.tzinfo is UTC


def test_skip_dates_are_not_sending_days() -> None:
    holidays = {date(2026, 12, 24), date(2026, 12, 25), date(2026, 12, 28)}
    policy = SendingPolicy(timezone="Europe/Berlin", skip_dates=frozenset(holidays))
    sent = at("2026-12-23T11:00+01:00")  # a Wednesday
    assert follow_up_earliest(policy, sent, parse_delay("1d")) == at("2026-12-29T08:00Z")
    assert follow_up_earliest(policy, sent, parse_delay("2d")) == at("2026-12-30T08:00Z")
    # elapsed time lands on a skip date: the next sending day's window
    assert follow_up_earliest(policy, sent, parse_delay("24h")) == at("2026-12-29T08:00Z")
    # the same without the skip dates
    assert follow_up_earliest(BERLIN, sent, parse_delay("1d")) == at("2026-12-24T08:00Z")


def test_a_recipient_zone_reads_the_days_and_windows_there() -> None:
    sent = at("2026-12-03T23:30Z")  # Friday 00:30 in Berlin, Thursday 18:30 in New York
    one = parse_delay("1d")
    assert follow_up_earliest(BERLIN, sent, one) == at("2026-12-07T08:00Z")
    assert follow_up_earliest(BERLIN, sent, one, "America/New_York") == at("2026-12-04T14:00Z")
    assert follow_up_earliest(BERLIN, sent, one, "Europe/Berlin") == at("2026-12-07T08:00Z")
    # elapsed: 18:30 + 4h in New York is 22:30 there, so 09:00 New York on Friday
    late = follow_up_earliest(BERLIN, sent, parse_delay("4h"), "America/New_York")
    assert late == at("2026-12-04T14:00Z")


@pytest.mark.parametrize(
    ("zone", "window", "sent", "after", "due"),
    [
        # Berlin springs forward 02:00 -> 03:00 on Sunday 2026-03-29: a 02:30 start is 03:00
        ("Europe/Berlin", (150, 600), "2026-03-28T10:00+01:00", "1d", "2026-03-29T01:00Z"),
        # Berlin falls back 03:00 -> 02:00 on Sunday 2026-10-25: the first 02:30 (CEST)
        ("Europe/Berlin", (150, 600), "2026-10-24T10:00+02:00", "1d", "2026-10-25T00:30Z"),
        # the day after a change: the new offset
        ("Europe/Berlin", (540, 1020), "2026-03-28T10:00+01:00", "2d", "2026-03-30T07:00Z"),
        ("Europe/Berlin", (540, 1020), "2026-10-24T10:00+02:00", "2d", "2026-10-26T08:00Z"),
        # elapsed time is elapsed: Sat 20:00 CET + 13h is 10:00 CEST on Sunday, not 09:00
        ("Europe/Berlin", (540, 1020), "2026-03-28T20:00+01:00", "13h", "2026-03-29T08:00Z"),
        ("Europe/Berlin", (540, 1020), "2026-10-24T20:00+02:00", "14h", "2026-10-25T08:00Z"),
        # New York springs forward 02:00 -> 03:00 on Sunday 2026-03-08
        ("America/New_York", (120, 600), "2026-03-07T10:00-05:00", "1d", "2026-03-08T07:00Z"),
        # a window wholly inside the gap holds no time: Sunday is no sending day
        ("America/New_York", (120, 180), "2026-03-07T10:00-05:00", "1d", "2026-03-09T06:00Z"),
        # New York falls back 02:00 -> 01:00 on Sunday 2026-11-01: the first 01:30 (EDT)
        ("America/New_York", (90, 600), "2026-10-31T10:00-04:00", "1d", "2026-11-01T05:30Z"),
        # 4h from 23:30 EDT on Saturday is 02:30 EST (not 03:30): inside a 02:00 window
        ("America/New_York", (120, 600), "2026-10-31T23:30-04:00", "4h", "2026-11-01T07:30Z"),
    ],
)
def test_dst_days(zone: str, window: tuple[int, int], sent: str, after: str, due: str) -> None:
    policy = SendingPolicy(timezone=zone, weekdays=EVERY_DAY, windows=(Window(*window),))
    # in the zone itself, where adding a timedelta to an aware datetime moves its wall clock
    local = at(sent).astimezone(ZoneInfo(zone))
    assert follow_up_earliest(policy, local, parse_delay(after)) == at(due)


def test_a_fall_back_across_midnight_never_gives_an_earlier_instant() -> None:
    # Goose Bay fell back at 00:01 on Sunday 2009-11-01, to 23:01 on Saturday: Sunday's first
    # minute (03:00Z) came before the repeated Saturday evening (03:01Z to 04:00Z)
    policy = SendingPolicy(
        timezone="America/Goose_Bay", weekdays=EVERY_DAY, windows=(Window(0, 60),)
    )
    sent = at("2009-11-01T03:30Z")  # Saturday 23:30, the second time
    assert sent.astimezone(policy.zone).date() == date(2009, 10, 31)
    assert follow_up_earliest(policy, sent, parse_delay("1d")) == at("2009-11-01T04:00Z")
    # sent before that first minute, the first minute is Sunday's first window time
    assert follow_up_earliest(policy, at("2009-11-01T02:59Z"), parse_delay("1d")) == at(
        "2009-11-01T03:00Z"
    )


def test_no_sending_day_is_a_clear_error() -> None:
    # every Monday for three years is a skip date, and Monday is the only weekday
    mondays = frozenset(date(2026, 11, 30) + timedelta(weeks=w) for w in range(160))
    policy = SendingPolicy(weekdays=frozenset({0}), skip_dates=mondays)
    for after in ("1d", "2h"):
        with pytest.raises(NoSendingDay, match="is a skip date"):
            follow_up_earliest(policy, at("2026-12-01T10:00+01:00"), parse_delay(after))
    # one Monday left near the end of the horizon is still found
    last = date(2028, 9, 25)
    policy = SendingPolicy(weekdays=frozenset({0}), skip_dates=mondays - {last})
    got = follow_up_earliest(policy, at("2026-12-01T10:00+01:00"), parse_delay("1d"))
    assert got == at("2028-09-25T07:00Z")


def test_bad_arguments_name_their_field() -> None:
    one = parse_delay("1d")
    cases: list[tuple[dict[str, object], str]] = [
        ({"sent_at": datetime(2026, 12, 1, 10)}, "sent_at"),
        ({"sent_at": "2026-12-01T10:00Z"}, "sent_at"),
        ({"delay": "1d"}, "after"),
        ({"zone": "Mars/Olympus"}, "zone"),
        ({"zone": ""}, "zone"),
        ({"sent_at": datetime(9999, 12, 31, 12, tzinfo=UTC)}, "sent_at"),  # a Friday
        ({"sent_at": datetime(9999, 12, 31, 12, tzinfo=UTC), "delay": Delay(24, HOURS)}, "sent_at"),
    ]
    for given_args, field in cases:
        args: dict[str, object] = {"sent_at": at("2026-12-01T10:00Z"), "delay": one, "zone": None}
        args.update(given_args)
        with pytest.raises(InvalidField) as exc:
            follow_up_earliest(BERLIN, **args)  # type: ignore[arg-type]
        assert field_of(exc) == field, given_args


# --- when a later step is due: properties -----------------------------------------------------


def inside(policy: SendingPolicy, instant: datetime) -> bool:
    """Independently of the code: the instant's wall time lies in a window of a sending day."""
    local = instant.astimezone(policy.zone)
    if local.weekday() not in policy.weekdays or local.date() in policy.skip_dates:
        return False
    minute = local.hour * 60 + local.minute + local.second / 60 + local.microsecond / 6e7
    return any(w.start_minute <= minute < w.end_minute for w in policy.windows)


def sending_day(policy: SendingPolicy, day: date) -> bool:
    # the windows below are two hours or longer, so no DST gap swallows a whole day's
    return day.weekday() in policy.weekdays and day not in policy.skip_dates


@st.composite
def policies(draw: st.DrawFn) -> SendingPolicy:
    start = draw(st.integers(0, 22 * 60))
    end = draw(st.integers(start + 120, 1440))
    weekdays = draw(st.frozensets(st.integers(0, 6), min_size=1))
    skips = draw(st.frozensets(st.integers(0, 60), max_size=12))
    return SendingPolicy(
        timezone=draw(st.sampled_from(ZONES)),
        weekdays=weekdays,
        windows=(Window(start, end),),
        skip_dates=frozenset(date(2026, 3, 1) + timedelta(days=d) for d in skips),
    )


SENT = st.datetimes(datetime(2026, 2, 20), datetime(2026, 5, 1), timezones=st.just(UTC))
DELAYS = st.one_of(
    st.builds(Delay, st.integers(1, 12), st.just(DAYS)),
    st.builds(Delay, st.integers(1, 300), st.just(HOURS)),
    st.builds(Delay, st.integers(1, 3000), st.just(MINUTES)),
)


@settings(max_examples=300, deadline=None)
@given(policy=policies(), sent=SENT, delay=DELAYS, zone=st.sampled_from([None, *ZONES]))
def test_the_result_is_a_window_instant_no_earlier_than_the_delay(
    policy: SendingPolicy, sent: datetime, delay: Delay, zone: str | None
) -> None:
    got = follow_up_earliest(policy, sent, delay, zone)
    local = replace(policy, timezone=zone or policy.timezone)
    assert got.tzinfo is UTC
    assert got.microsecond % 1000 == 0
    assert inside(local, got)
    elapsed = delay.elapsed
    if elapsed is not None:
        assert got >= sent + elapsed
        # nothing earlier qualifies: the instant itself, or one ms before it is outside
        before = got - timedelta(milliseconds=1)
        assert before < sent + elapsed or not inside(local, before)
    else:
        assert got > sent
        assert got.astimezone(local.zone).date() >= sent.astimezone(local.zone).date() + timedelta(
            days=delay.amount
        )


@settings(max_examples=300, deadline=None)
@given(
    policy=policies(),
    sent=SENT,
    days=st.integers(1, 12),
    zone=st.sampled_from([None, *ZONES]),
)
def test_a_days_delay_lands_on_the_nth_sending_day_at_its_first_window(
    policy: SendingPolicy, sent: datetime, days: int, zone: str | None
) -> None:
    got = follow_up_earliest(policy, sent, Delay(days, DAYS), zone)
    tz = ZoneInfo(zone or policy.timezone)
    sent_day, got_day = sent.astimezone(tz).date(), got.astimezone(tz).date()
    between = [
        sent_day + timedelta(days=d)
        for d in range(1, (got_day - sent_day).days)
        if sending_day(policy, sent_day + timedelta(days=d))
    ]
    assert len(between) == days - 1
    assert sending_day(policy, got_day)
    # the first window's start: a millisecond before is outside it or on another day
    before = (got - timedelta(milliseconds=1)).astimezone(tz)
    minute = before.hour * 60 + before.minute + before.second / 60
    window = policy.windows[0]
    assert before.date() != got_day or not window.start_minute <= minute < window.end_minute


@settings(max_examples=200, deadline=None)
@given(
    policy=policies(),
    sent=SENT,
    later=st.timedeltas(timedelta(0), timedelta(days=9)),
    delay=DELAYS,
    zone=st.sampled_from([None, *ZONES]),
)
def test_a_later_send_is_never_due_earlier(
    policy: SendingPolicy, sent: datetime, later: timedelta, delay: Delay, zone: str | None
) -> None:
    first_due = follow_up_earliest(policy, sent, delay, zone)
    assert follow_up_earliest(policy, sent + later, delay, zone) >= first_due


@settings(max_examples=100, deadline=None)
@given(policy=policies(), sent=SENT, days=st.integers(1, 11), zone=st.sampled_from(ZONES))
def test_one_more_day_is_strictly_later(
    policy: SendingPolicy, sent: datetime, days: int, zone: str
) -> None:
    shorter = follow_up_earliest(policy, sent, Delay(days, DAYS), zone)
    longer = follow_up_earliest(policy, sent, Delay(days + 1, DAYS), zone)
    assert longer > shorter
    tz = ZoneInfo(zone)
    assert longer.astimezone(tz).date() > shorter.astimezone(tz).date()
