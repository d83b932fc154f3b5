"""plural(): the counts every message shows, in the singular for one."""

from __future__ import annotations

import pytest

from sendqueue.domain.wording import plural


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, "0 emails"), (1, "1 email"), (2, "2 emails"), (-1, "-1 email"), (1000, "1000 emails")],
)
def test_a_regular_word_takes_an_s_except_for_one(count: int, expected: str) -> None:
    assert plural(count, "email") == expected


def test_an_irregular_plural_is_given_explicitly() -> None:
    assert plural(1, "address", "addresses") == "1 address"
    assert plural(3, "address", "addresses") == "3 addresses"
    assert plural(2, "missing schedule") == "2 missing schedules"
    assert plural(1, "missing schedule") == "1 missing schedule"
