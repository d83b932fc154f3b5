"""A campaign's steps as stored: ``steps_to_data`` and ``steps_from_data``."""

from __future__ import annotations

import json

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import Step, parse_delay, steps_from_data, steps_to_data

STEPS = (
    Step(1, "Hi {{ name }}", "Dear {{ name }}\n", "<p>Hi</p>", None),
    Step(2, None, "Thoughts?\n", None, parse_delay("3d")),
    Step(3, "Fresh", "Last\n", None, parse_delay("90m"), new_thread=True),
)


def test_steps_round_trip_through_json() -> None:
    data = json.loads(json.dumps(steps_to_data(STEPS)))
    assert data[1] == {
        "subject": None, "text": "Thoughts?\n", "html": None, "after": "3d", "new_thread": False,
    }  # fmt: skip
    assert steps_from_data(data) == STEPS


@pytest.mark.parametrize("empty", [None, []])
def test_nothing_stored_is_no_steps(empty: object) -> None:
    assert steps_from_data(empty) == ()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"subject": "x"}, "steps"),
        (["x"], "steps"),
        ([{"subject": "s", "text": "t"}, {"text": "u"}], "steps[2].after"),
        ([{"subject": "s", "text": "t"}, {"text": "u", "after": "soon"}], "steps[2].after"),
        ([{"text": "t"}], "steps[1].subject"),
    ],
)
def test_stored_steps_that_are_not_a_sequence_are_refused(data: object, field: str) -> None:
    with pytest.raises(InvalidField) as info:
        steps_from_data(data)
    assert info.value.field == field
