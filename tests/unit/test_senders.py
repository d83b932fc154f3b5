"""Senders: validation names the field, the warm-up ramps per sending day to the cap,
credentials are masked."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.senders import Sender, masked_transport, new_sender_id


def sender(**fields: object) -> Sender:
    values: dict[str, object] = {"id": "s1", "email": "sales@example.com", **fields}
    return Sender(**values)  # type: ignore[arg-type]


def test_defaults() -> None:
    s = sender(name="Ada Sales")
    assert (s.daily_cap, s.min_gap_seconds, s.timezone) == (50, 60, "Europe/Berlin")
    assert new_sender_id().startswith("s") and "@" not in new_sender_id()


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"email": "not an address"}, "email"),
        ({"email": "Ada <sales@example.com>"}, "email"),
        ({"name": "Ada\r\nBcc: x@example.com"}, "name"),
        ({"reply_to": "nope"}, "reply_to"),
        ({"daily_cap": 0}, "daily_cap"),
        ({"daily_cap": 10_001}, "daily_cap"),
        ({"daily_cap": True}, "daily_cap"),
        ({"min_gap_seconds": 0}, "min_gap_seconds"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"transport": "http://example.com"}, "transport"),
        ({"transport": "smtp://h\n:25"}, "transport"),
        ({"warmup_start": 5}, "warmup_step"),
        ({"warmup_step": 5}, "warmup_start"),
        ({"warmup_start": 5, "warmup_step": 5}, "warmup_from"),
        ({"warmup_start": 60, "warmup_step": 5, "warmup_from": date(2026, 1, 1)}, "warmup_start"),
        ({"warmup_start": 5, "warmup_step": 0, "warmup_from": date(2026, 1, 1)}, "warmup_step"),
        ({"id": "a@b"}, "id"),
    ],
)
def test_every_bad_field_is_named(fields: dict[str, object], name: str) -> None:
    with pytest.raises(InvalidField) as caught:
        sender(**fields)
    assert caught.value.field == name


def test_a_bad_transport_error_does_not_show_its_password() -> None:
    with pytest.raises(InvalidField) as caught:
        sender(transport="imap://user:hunter2@mail.example.com")
    assert "hunter2" not in str(caught.value)


def test_the_repr_leaves_the_transport_out() -> None:
    s = sender(transport="smtp://user:hunter2@mail.example.com:587?security=starttls")
    assert "hunter2" not in repr(s)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("smtp://user:hunter2@mail.example.com:587", "smtp://user:***@mail.example.com:587"),
        ("smtp://mail.example.com:25", "smtp://mail.example.com:25"),
        ("smtps://u:p%40ss@h:465?security=tls", "smtps://u:***@h:465"),
        ("ses:eu-west-1", "ses:eu-west-1"),
        (None, None),
    ],
)
def test_masked_transport(url: str | None, shown: str | None) -> None:
    assert masked_transport(url) == shown


def test_the_warm_up_ramps_per_sending_day_up_to_the_cap() -> None:
    s = sender(daily_cap=30, warmup_start=5, warmup_step=10, warmup_from=date(2026, 12, 7))
    # sending on Monday 7th, Tuesday 8th and Monday 14th; the weekend and idle days between
    sending = [date(2026, 12, 3), date(2026, 12, 7), date(2026, 12, 8), date(2026, 12, 14)]
    caps = {d: s.cap_on(date(2026, 12, d), sending) for d in (6, 7, 8, 9, 13, 14, 15)}
    # the 3rd is before the warm-up was set: it does not count
    assert caps == {6: 5, 7: 5, 8: 15, 9: 25, 13: 25, 14: 25, 15: 30}
    assert s.cap_on(date(2027, 6, 1), []) == 5  # idle for months: still the first day's
    assert sender(daily_cap=30).cap_on(date(2026, 12, 7), sending) == 30


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(1, 500),
    data=st.data(),
    offsets=st.lists(st.integers(-30, 400), min_size=2, max_size=10),
    sending=st.lists(st.integers(-30, 400), max_size=20, unique=True),
)
def test_the_ramp_never_falls_and_never_passes_the_cap(
    cap: int, data: st.DataObject, offsets: list[int], sending: list[int]
) -> None:
    start = data.draw(st.integers(1, cap))
    step = data.draw(st.integers(1, cap))
    first = date(2026, 3, 1)
    s = sender(daily_cap=cap, warmup_start=start, warmup_step=step, warmup_from=first)
    days = sorted(date.fromordinal(first.toordinal() + o) for o in offsets)
    held = sorted(date.fromordinal(first.toordinal() + o) for o in sending)
    caps = [s.cap_on(d, held) for d in days]
    assert caps == sorted(caps)
    assert all(start <= c <= cap for c in caps)
    for d in days:
        steps = sum(1 for h in held if first <= h < d)
        assert s.cap_on(d, held) == min(cap, start + step * steps)
        # another sending day never lowers a cap
        extra = data.draw(st.integers(-30, 400))
        more = sorted({*held, date.fromordinal(first.toordinal() + extra)})
        assert s.cap_on(d, more) >= s.cap_on(d, held)
