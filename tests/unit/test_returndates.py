"""The return date of out-of-office notices, English and German, and those that name none."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sendqueue.domain.returndates import MAX_AHEAD_DAYS, return_date

RECEIVED = date(2026, 12, 5)  # a Saturday
BACK = date(2026, 12, 14)


@pytest.mark.parametrize(
    "text",
    [
        "I am back on 14 December.",
        "I am out of the office and will be back on Monday, 14 December 2026.",
        "returning 2026-12-14",
        "out of office until Monday 14.12.2026",
        "Out of office until 14/12/2026, with limited access to email.",
        "I will return on December 14th, 2026.",
        "I'm away until Dec. 14 and will answer then.",
        "Back in the office on the 14th of December.",
        "I'm on leave through 13 December.",
        "Thank you for your message. I am out until 14.12.26.",
        "Ich bin bis zum 14.12.2026 nicht im Büro.",
        "Ich bin ab dem 14. Dezember wieder erreichbar.",
        "Vielen Dank. Ab Montag, 14.12. bin ich wieder im Büro.",
        "Ich bin am 14.12. wieder da.",
        "Ich bin bis einschließlich 13.12.2026 im Urlaub.",
        "Abwesend bis 13. Dezember (einschließlich).",
        "Zurück am 14. Dez.",
        "Ich bin vom 1.12. bis 14.12. abwesend.",
        "I am away from 1 December until 14 December.",
        "Automatic reply: back 12/14/2026",
    ],
)
def test_a_return_date_is_read(text: str) -> None:
    assert return_date(text, received=RECEIVED) == BACK


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I am out of the office with limited access to email.",
        "I will be back next week.",
        "Ich bin ab Montag wieder erreichbar.",
        "Back on 31.02.2027",  # no such day
        "Back on 14.13.2026",  # no month 13
        "back on 05/06/2027",  # the 5th of June or May the 6th
        "I was back on 1 December 2026.",  # before the notice came
        "Back on 14 December 2030.",  # years ahead: not what was meant
        "The meeting on 14 December is moved.",  # no phrase announcing a return
        "I am away from 1 December.",  # the start of the absence
    ],
)
def test_no_date_is_read_when_none_can_be(text: str) -> None:
    assert return_date(text, received=RECEIVED) is None


def test_a_date_without_a_year_is_the_next_such_day() -> None:
    assert return_date("back on 4 January", received=RECEIVED) == date(2027, 1, 4)
    assert return_date("zurück am 5.12.", received=RECEIVED) == RECEIVED


@given(st.text(max_size=200), st.dates(min_value=date(1990, 1, 1), max_value=date(9000, 1, 1)))
def test_any_text_gives_a_day_in_reach_or_none(text: str, received: date) -> None:
    found = return_date(text, received=received)
    assert found is None or 0 <= (found - received).days <= MAX_AHEAD_DAYS
