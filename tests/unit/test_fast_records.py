"""The records provisioning builds without their frozen dataclass's ``__init__``
(``pending_task``, ``recipient_of``, ``planned_booking``) must equal the constructor's, field
for field; and the inline checks of ``check_due_many`` must refuse what ``create``'s checks
refuse."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import Recipient, Task, pending_task, recipient_of
from sendqueue.domain.senders import Booking, planned_booking

_text = st.text(max_size=20)
_maybe = st.none() | _text
_instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


def _same(built: object, made: object) -> None:
    """Equal, with every field of the same value and type, and nothing more in ``__dict__``."""
    assert dataclasses.is_dataclass(made)
    assert type(built) is type(made)
    assert built == made
    names = [f.name for f in dataclasses.fields(made)]
    assert list(vars(built)) == list(vars(made)) == names
    for name in names:
        assert type(getattr(built, name)) is type(getattr(made, name)), name
    assert repr(built) == repr(made)


@given(
    st.integers(0, 10**9), _text, _text, _text, _text, _maybe, _instants, _instants,
    _maybe, _maybe, _maybe, st.integers(1, 10),
)  # fmt: skip
def test_pending_task_is_the_task_the_constructor_builds(
    position: int,
    email: str,
    name: str,
    subject: str,
    text: str,
    html: str | None,
    send_at: datetime,
    at: datetime,
    sender_id: str | None,
    sender: str | None,
    zone: str | None,
    step: int,
) -> None:
    built = pending_task(
        "c1-5", "c1", position, email, name, subject, text, html, send_at, "t" * 32, at,
        sender_id, sender, zone, step,
    )  # fmt: skip
    made = Task(
        id="c1-5", campaign_id="c1", position=position, email=email, name=name,
        subject=subject, text=text, html=html, send_at=send_at, token="t" * 32, created_at=at,
        updated_at=at, sender_id=sender_id, sender=sender, timezone=zone, step=step,
    )  # fmt: skip
    _same(built, made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.email = "x"  # type: ignore[misc]
    assert dataclasses.replace(built, reason="r") == dataclasses.replace(made, reason="r")


@given(st.integers(0, 10**9), _text, _text, _text, _text, _maybe, _maybe)
def test_recipient_of_is_the_recipient_the_constructor_builds(
    position: int,
    email: str,
    name: str,
    subject: str,
    text: str,
    html: str | None,
    zone: str | None,
) -> None:
    variables = {"city": "Berlin"}
    args = (position, email, name, subject, text, html, variables, zone)
    _same(recipient_of(*args), Recipient(*args))


@given(_instants, st.integers(1, 10**6))
def test_planned_booking_is_the_booking_the_constructor_builds(at: datetime, cap: int) -> None:
    args = ("s1", at, at.date(), "c1-5", "c1", "a@example.com", cap)
    built, made = planned_booking(*args), Booking(*args)
    _same(built, made)
    assert built.at_ms == made.at_ms


def test_planned_booking_checks_what_the_constructor_checks() -> None:
    day = date(2026, 12, 4)
    berlin = datetime(2026, 12, 4, 10, 0, tzinfo=timezone(timedelta(hours=1)))
    # Another zone is converted to UTC, as the constructor converts it.
    converted = planned_booking("s1", berlin, day, "t", "c", "a@x", 5)
    assert converted.at == berlin.astimezone(UTC) and converted.at.tzinfo is UTC
    assert converted == Booking("s1", berlin, day, "t", "c", "a@x", 5)
    for bad_at, bad_cap, field in [
        (datetime(2026, 12, 4, 10, 0), 5, "at"),
        (berlin, 0, "cap"),
        (berlin, True, "cap"),
    ]:
        with pytest.raises(InvalidField) as raised:
            planned_booking("s1", bad_at, day, "t", "c", "a@x", bad_cap)
        assert raised.value.field == field


_GOOD: tuple[Any, ...] = (
    "sq-c1-5.0", "sq-c1", datetime(2026, 12, 7, 9, 0), "Europe/Berlin",
    {"kind": "send"}, "tok", 2,
)  # fmt: skip


@pytest.mark.parametrize(
    ("index", "value", "field"),
    [
        (0, 5, "name"),
        (0, "bad name", "name"),
        (0, "", "name"),
        (1, "bad group", "group"),
        (2, datetime(2026, 12, 7, 9, 0, tzinfo=UTC), "at_local"),
        (2, date(2026, 12, 7), "at_local"),
        (3, "Mars/Olympus", "timezone"),
        (3, None, "timezone"),
        (4, {"kind": 1}, "payload"),
        (5, "a.b", "client_token"),
        (5, 7, "client_token"),
        (6, -1, "max_retries"),
    ],
)
def test_create_refuses_each_bad_field_by_name(index: int, value: object, field: str) -> None:
    bad = list(_GOOD)
    bad[index] = value
    with pytest.raises(InvalidField) as one:
        rules.build_schedule(*bad, created_at=datetime.now(UTC))
    assert one.value.field == field


def test_create_reads_the_wall_time_in_its_own_zone() -> None:
    name, group, at_local, _, payload, token, retries = _GOOD
    zones = ("Europe/Berlin", "America/New_York", "Europe/Berlin", "UTC")
    built = [
        rules.build_schedule(
            name, group, at_local, zone, payload, token, retries, created_at=datetime.now(UTC)
        )
        for zone in zones
    ]
    assert [b.due_at for b in built] == [rules.due_at(at_local, zone) for zone in zones]
    assert [b.due_at.hour for b in built] == [8, 14, 8, 9]


_DUE: tuple[Any, ...] = (*_GOOD[:2], datetime(2026, 12, 7, 8, 0, tzinfo=UTC), *_GOOD[3:])


@pytest.mark.parametrize(
    ("index", "value", "field"),
    [
        (0, 5, "name"),
        (0, "bad name", "name"),
        (1, "bad group", "group"),
        (2, datetime(2026, 12, 7, 9, 0), "due_at"),
        (2, date(2026, 12, 7), "due_at"),
        (2, "2026-12-07T08:00:00+00:00", "due_at"),
        (3, "Mars/Olympus", "timezone"),
        (3, None, "timezone"),
        (4, {"kind": 1}, "payload"),
        (5, "a.b", "client_token"),
        (6, -1, "max_retries"),
        (6, True, "max_retries"),
    ],
)
def test_check_due_many_refuses_what_create_refuses(index: int, value: object, field: str) -> None:
    """A bulk item's checks are ``create``'s, its instant checked in the wall time's place."""
    bad = list(_DUE)
    bad[index] = value
    with pytest.raises(InvalidField) as raised:
        rules.check_due_many([_DUE, tuple(bad)])
    assert raised.value.field == field


def test_check_due_many_reads_each_instant_in_its_own_zone_as_the_same_instant() -> None:
    """An instant given in any zone is taken as that instant (in UTC), its wall time read in
    the item's zone."""
    plus_two = _DUE[2].astimezone(timezone(timedelta(hours=2)))
    items = [
        (*_DUE[:2], at, zone, *_DUE[4:])
        for at, zone in ((_DUE[2], "Europe/Berlin"), (plus_two, "America/New_York"))
    ]
    checked = rules.check_due_many(items)
    assert [c[-1] for c in checked] == [_DUE[2], _DUE[2]]
    assert all(c[-1].tzinfo is UTC for c in checked)
    assert [rules.wall_time(c[2]) for c in checked] == [
        datetime(2026, 12, 7, 9, 0),
        datetime(2026, 12, 7, 3, 0),
    ]
