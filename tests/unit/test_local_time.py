"""Each recipient's own time zone (issue 13): the ``timezone`` column of the import, and the
preview of a local-time campaign, per zone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.bootstrap import Container
from sendqueue.domain import capacity
from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.domain.models import Recipient
from sendqueue.domain.planner import per_day_summary, per_zone_day_summary
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.services.campaigns import preview as previews_module
from sendqueue.services.campaigns.preview import PlanSummary, ZoneDays
from sendqueue.services.importing.recipients import Templates, parse_recipients
from sendqueue.services.importing.rows import parse_recipient_rows
from sendqueue.services.importing.stream import check_csv, check_rows
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, fake_app

BERLIN, NEW_YORK, TOKYO = "Europe/Berlin", "America/New_York", "Asia/Tokyo"
#: Office hours on weekdays, in the campaign's zone or, local-time, in each recipient's.
OFFICE = SendingPolicy(
    timezone=BERLIN,
    per_day=10,
    weekdays=frozenset(range(5)),
    windows=(Window(9 * 60, 17 * 60),),
    start=T0,
)


def _csv(*rows: str, header: str = "email,subject,body,timezone") -> bytes:
    return ("\n".join([header, *rows]) + "\n").encode()


def _app() -> Container:
    return fake_app(store=InMemoryTaskStore())


def _stored(app: Container, cid: str) -> list[Recipient]:
    return app.store.list_recipients(cid, limit=10_000)


def _inside(policy: SendingPolicy, zone: str, at: datetime) -> bool:
    """Whether ``at`` lies in the policy's windows on a sending day, on ``zone``'s wall clock."""
    local = at.astimezone(ZoneInfo(zone))
    second = local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
    return (
        local.weekday() in policy.weekdays
        and local.date() not in policy.skip_dates
        and any(w.start_minute * 60 <= second < w.end_minute * 60 for w in policy.windows)
    )


# -- the import ------------------------------------------------------------------------------


def test_the_timezone_column_is_read_trimmed_and_an_empty_cell_is_none() -> None:
    result = parse_recipients(
        _csv(
            "a@example.com,s,b,Europe/Berlin",
            "b@example.com,s,b,  America/New_York ",
            "c@example.com,s,b,",
            'd@example.com,s,b,"   "',
        )
    )
    assert [r.timezone for r in result.recipients] == [BERLIN, NEW_YORK, None, None]
    # a column with a meaning of its own, like name and subject: not a template variable
    assert all(r.variables == {} for r in result.recipients)


def test_the_column_name_is_matched_ignoring_case_and_templates_see_the_zone() -> None:
    result = parse_recipients(
        _csv("a@example.com,Asia/Tokyo,x", "b@example.com,,y", header="email,TimeZone,plan"),
        templates=Templates(subject="for {{ timezone or 'you' }}", body="{{ plan }}"),
    )
    assert [(r.timezone, r.subject) for r in result.recipients] == [
        (TOKYO, "for Asia/Tokyo"),
        (None, "for you"),
    ]
    assert result.recipients[0].variables == {"plan": "x"}


def test_without_the_column_every_recipient_has_the_campaign_zone() -> None:
    result = parse_recipients(_csv("a@example.com,s,b", header="email,subject,body"))
    assert result.recipients[0].timezone is None


def test_an_unknown_zone_names_its_row_and_value() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_recipients(_csv("a@example.com,s,b,Europe/Berlin", "b@example.com,s,b,Mars/Olympus"))
    [error] = info.value.errors
    assert (error.field, error.row, error.value) == ("timezone", 3, "Mars/Olympus")
    assert "unknown IANA timezone" in error.reason
    assert "row 3" in str(error) and "Mars/Olympus" in str(error)


def test_a_miscased_zone_gets_a_hint() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_recipients(_csv("a@example.com,s,b,europe/berlin"))
    [error] = info.value.errors
    assert error.field == "timezone" and "did you mean Europe/Berlin?" in error.reason


def test_every_bad_row_is_reported_together_with_the_other_row_errors() -> None:
    source = _csv(
        "a@example.com,s,b,Nowhere/Land",  # row 2
        "b@example.com,s,b,Asia/Tokyo",  # row 3: fine
        "not-an-address,s,b,Europe",  # row 4: two problems (a region, not a zone)
        "",  # row 5: blank, skipped, still counted
        "d@example.com,s,b,UTC+1",  # row 6
    )
    with pytest.raises(InvalidInput) as info:
        parse_recipients(source)
    found = [(e.row, e.field, e.value) for e in info.value.errors]
    assert found == [
        (2, "timezone", "Nowhere/Land"),
        (4, "email", "not-an-address"),
        (4, "timezone", "Europe"),
        (6, "timezone", "UTC+1"),
    ]
    assert info.value.total == 4
    assert str(info.value).startswith("3 of 4 rows are invalid")


def test_a_huge_zone_cell_is_a_row_error_with_a_clipped_value() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_recipients(_csv("a@example.com,s,b," + "x" * 5000))
    [error] = info.value.errors
    assert error.field == "timezone" and "5000 characters" in str(error.value)


def test_the_json_rows_take_a_timezone_key() -> None:
    result = parse_recipient_rows(
        [
            {"email": "a@example.com", "subject": "s", "body": "b", "timezone": TOKYO},
            {"email": "b@example.com", "subject": "s", "body": "b", "timezone": None},
            {"email": "c@example.com", "subject": "s", "body": "b"},
        ]
    )
    assert [r.timezone for r in result.recipients] == [TOKYO, None, None]
    with pytest.raises(InvalidInput) as info:
        check_rows(
            [
                {"email": "a@example.com", "subject": "s", "body": "b", "timezone": "Atlantis"},
                {"email": "b@example.com", "subject": "s", "body": "b", "timezone": 5},
            ]
        )
    # the first recipient is row 2, as in a CSV file with a header
    assert [(e.row, e.field, e.value) for e in info.value.errors] == [
        (2, "timezone", "Atlantis"),
        (3, "timezone", "5"),
    ]


def test_a_checked_import_keeps_the_zones_through_its_spill_file() -> None:
    rows = [f"u{i}@example.com,s,b,{[BERLIN, '', TOKYO][i % 3]}" for i in range(2500)]
    checked = check_csv(_csv(*rows))
    zones = [r.timezone for r in checked.recipients()]
    assert zones == [[BERLIN, None, TOKYO][i % 3] for i in range(2500)]
    assert checked.zoned == 2500 - 833
    assert check_rows([{"email": "a@example.com", "subject": "s", "body": "b"}]).zoned == 0


def test_create_with_a_bad_zone_stores_nothing() -> None:
    app = _app()
    bad = _csv("a@example.com,s,b,Europe/Berlin", "b@example.com,s,b,Europe/Berln")
    with pytest.raises(InvalidInput) as info:
        app.campaign_import.create(name="x", recipients=bad, policy=OFFICE, local_time=True)
    assert [(e.row, e.field, e.value) for e in info.value.errors] == [
        (3, "timezone", "Europe/Berln")
    ]
    with pytest.raises(InvalidInput):
        app.campaign_import.create_from_rows(
            name="x",
            rows=[{"email": "a@example.com", "subject": "s", "body": "b", "timezone": "Nope"}],
            policy=OFFICE,
            local_time=True,
        )
    assert app.store.list_campaigns() == []


def test_create_stores_each_recipients_zone() -> None:
    app = _app()
    created = app.campaign_import.create(
        name="x",
        recipients=_csv("a@example.com,s,b,Asia/Tokyo", "b@example.com,s,b,"),
        policy=OFFICE,
        local_time=True,
    )
    assert created.campaign.local_time is True
    assert [r.timezone for r in _stored(app, created.campaign.id)] == [TOKYO, None]


def test_a_zone_column_without_local_time_is_kept_and_does_not_move_the_windows() -> None:
    """The zones are stored (switching the campaign's mode needs no new import), the plan is
    the campaign zone's plan exactly, and the preview says it is not local-time."""
    app = _app()
    rows = [f"u{i}@example.com,s,b,{TOKYO if i % 2 else ''}" for i in range(30)]
    zoned = app.campaign_import.create(name="z", recipients=_csv(*rows), policy=OFFICE)
    assert zoned.imported.zoned == 15
    plain = app.campaign_import.create(
        name="p",
        recipients=_csv(*[f"u{i}@example.com,s,b" for i in range(30)], header="email,subject,body"),
        policy=OFFICE,
    )
    cid = zoned.campaign.id
    assert [r.timezone for r in _stored(app, cid)][:2] == [None, TOKYO]

    sends = [at for _, at in app.campaign_previews.preview(cid)]
    assert sends == [at for _, at in app.campaign_previews.preview(plain.campaign.id)]
    assert all(_inside(OFFICE, BERLIN, at) for at in sends)
    summary = app.campaign_previews.preview_summary(cid)
    assert summary.local_time is False
    assert summary.zones == (ZoneDays(BERLIN, summary.days, 30),)
    assert set(summary.first_zones) == {BERLIN}


# -- the preview, per zone -------------------------------------------------------------------


def _world(app: Container, count: int = 30, policy: SendingPolicy = OFFICE) -> str:
    """A local-time campaign whose recipients take turns: Berlin (the campaign's zone, by no
    zone of their own), New York, Tokyo."""
    zones = ["", NEW_YORK, TOKYO]
    rows = [f"u{i}@example.com,s,b,{zones[i % 3]}" for i in range(count)]
    created = app.campaign_import.create(
        name="world", recipients=_csv(*rows), policy=policy, local_time=True
    )
    return created.campaign.id


def test_each_zones_sends_are_inside_the_window_on_that_zones_wall_clock() -> None:
    app = _app()
    cid = _world(app)
    pairs = app.campaign_previews.preview(cid)
    assert [r.position for r, _ in pairs] == list(range(30))
    hours: dict[str, set[int]] = {}
    for recipient, at in pairs:
        zone = recipient.timezone or BERLIN
        assert _inside(OFFICE, zone, at), (zone, at.astimezone(ZoneInfo(zone)))
        assert at >= T0
        hours.setdefault(zone, set()).add(at.astimezone(ZoneInfo(zone)).hour)
    # the same window, three wall clocks: none of it is Berlin's 09:00-17:00 for New York
    assert all(9 <= h < 17 for h in hours[NEW_YORK])
    ny_in_berlin = {at.astimezone(ZoneInfo(BERLIN)).hour for r, at in pairs if r.timezone}
    assert ny_in_berlin - set(range(9, 17))
    # per_day is counted per local day of the campaign's zone, across all zones
    per_day = Counter(at.astimezone(ZoneInfo(BERLIN)).date() for _, at in pairs)
    assert max(per_day.values()) <= OFFICE.per_day


def test_the_summary_counts_per_day_in_the_campaign_zone_and_per_zone_in_its_own_days() -> None:
    app = _app()
    cid = _world(app)
    pairs = app.campaign_previews.preview(cid)
    summary = app.campaign_previews.preview_summary(cid)
    assert isinstance(summary, PlanSummary)
    assert summary.local_time is True
    assert summary.count == 30
    sends = [at for _, at in pairs]
    assert summary.days == tuple(per_day_summary(sends, BERLIN))
    assert all(day.count <= OFFICE.per_day for day in summary.days)
    assert sum(day.count for day in summary.days) == 30

    assert [z.zone for z in summary.zones] == [BERLIN, NEW_YORK, TOKYO]
    for entry in summary.zones:
        mine = [at for r, at in pairs if (r.timezone or BERLIN) == entry.zone]
        assert entry.count == len(mine) == 10
        assert entry.days == tuple(per_day_summary(mine, entry.zone))
        assert all(d.first.tzinfo == ZoneInfo(entry.zone) for d in entry.days)
        assert sum(d.count for d in entry.days) == entry.count

    # the first sends in time order, each with its address and zone
    assert list(summary.first) == sorted(sends)
    by_email = {r.email: (at, r.timezone or BERLIN) for r, at in pairs}
    assert [by_email[e] for e in summary.emails] == list(
        zip(summary.first, summary.first_zones, strict=True)
    )


def test_tokyo_goes_first_and_new_york_last_on_the_first_day() -> None:
    """Berlin's Tuesday 09:00 (T0) is already Tuesday 17:00 in Tokyo: Tokyo's first send is on
    Wednesday from its 09:00 (01:00 in Berlin); New York's from 09:00 there (15:00 in Berlin)."""
    app = _app()
    cid = _world(app, count=3)
    first = {r.timezone or BERLIN: at for r, at in app.campaign_previews.preview(cid)}
    tokyo = first[TOKYO].astimezone(ZoneInfo(TOKYO))
    assert tokyo.date() == date(2026, 12, 2) and tokyo.hour >= 9
    assert first[BERLIN] < first[NEW_YORK]
    assert first[NEW_YORK].astimezone(ZoneInfo(NEW_YORK)).date() == date(2026, 12, 1)


def test_the_local_time_preview_is_cached_like_any_other(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = capacity.plan_with_senders

    def counting(*args: Any, **kwargs: Any) -> list[datetime]:
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(previews_module, "plan_with_senders", counting)
    clock = FakeClock(T0 + timedelta(seconds=5))
    app = fake_app(clock=clock, store=InMemoryTaskStore())
    cid = _world(app)
    first = app.campaign_previews.preview_summary(cid)
    clock.advance(seconds=30)
    assert app.campaign_previews.preview_summary(cid) is first
    assert calls == [30]
    clock.advance(minutes=1)
    app.campaign_previews.preview_summary(cid)
    assert calls == [30, 30]


def test_per_zone_day_summary_orders_the_campaign_zone_first() -> None:
    at = datetime(2026, 12, 1, 23, 30, tzinfo=UTC)  # Wednesday in Berlin and Tokyo, not in NY
    summary = per_zone_day_summary([at, at, at, at], [TOKYO, None, NEW_YORK, BERLIN], BERLIN)
    assert list(summary) == [BERLIN, NEW_YORK, TOKYO]
    assert [(d.day, d.count) for d in summary[BERLIN]] == [(date(2026, 12, 2), 2)]
    assert [(d.day, d.count) for d in summary[NEW_YORK]] == [(date(2026, 12, 1), 1)]
    assert summary[TOKYO][0].first.tzinfo == ZoneInfo(TOKYO)
    assert per_zone_day_summary([], [], BERLIN) == {}
    with pytest.raises(InvalidField) as info:
        per_zone_day_summary([at], [], BERLIN)
    assert info.value.field == "zones"


# -- the property ----------------------------------------------------------------------------

_ZONES = [
    None,
    BERLIN,
    NEW_YORK,
    TOKYO,
    "Australia/Lord_Howe",  # a half-hour DST shift
    "Asia/Kathmandu",  # +05:45
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/St_Johns",  # -03:30 / -02:30
    "UTC",
]
#: The fake clock: the first of March, so that plans cross the spring and autumn changes.
_NOW = datetime(2026, 3, 1, tzinfo=UTC)


@st.composite
def _policies(draw: st.DrawFn) -> SendingPolicy:
    bounds = sorted(draw(st.lists(st.integers(0, 96), min_size=2, max_size=4, unique=True)))
    windows = tuple(
        Window(bounds[i] * 15, bounds[i + 1] * 15) for i in range(0, len(bounds) - 1, 2)
    )
    start = _NOW + timedelta(hours=draw(st.integers(0, 24 * 270)))
    skips = draw(st.lists(st.integers(0, 20), max_size=3))
    return SendingPolicy(
        timezone=draw(st.sampled_from([BERLIN, NEW_YORK, "UTC", "Australia/Lord_Howe"])),
        per_day=draw(st.integers(1, 30)),
        weekdays=draw(st.frozensets(st.integers(0, 6), min_size=1)),
        windows=windows,
        start=start,
        skip_dates=frozenset(start.date() + timedelta(days=d) for d in skips),
    )


@settings(max_examples=150, deadline=None)
@given(policy=_policies(), zones=st.lists(st.sampled_from(_ZONES), min_size=1, max_size=40))
def test_every_send_of_a_local_time_campaign_is_inside_its_recipients_window(
    policy: SendingPolicy, zones: Sequence[str | None]
) -> None:
    app = fake_app(clock=FakeClock(_NOW), store=InMemoryTaskStore())
    rows = [
        {"email": f"u{i}@example.com", "subject": "s", "body": "b", "timezone": zone}
        for i, zone in enumerate(zones)
    ]
    cid = app.campaign_import.create_from_rows(
        name="p", rows=rows, policy=policy, local_time=True
    ).campaign.id
    pairs = app.campaign_previews.preview(cid)
    assert [r.timezone for r, _ in pairs] == list(zones)
    for recipient, at in pairs:
        zone = recipient.timezone or policy.timezone
        assert at >= max(_NOW, policy.start or _NOW)
        assert _inside(policy, zone, at), (zone, at.astimezone(ZoneInfo(zone)))
    per_day = Counter(at.astimezone(policy.zone).date() for _, at in pairs)
    assert max(per_day.values()) <= policy.per_day
    summary = app.campaign_previews.preview_summary(cid)
    assert summary.count == len(zones)
    assert sum(z.count for z in summary.zones) == len(zones)
    assert {z.zone for z in summary.zones} == {z or policy.timezone for z in zones}
