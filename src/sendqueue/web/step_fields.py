"""A sequence's later steps from the new-campaign form: the fields ``steps[k].subject``,
``steps[k].text``, ``steps[k].html``, ``steps[k].after`` and ``steps[k].new_thread`` for
steps 2 to 10 (the form's subject, body and HTML are step 1). An empty slot is no step; the
steps filled must follow one another from step 2."""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import FormData

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import MAX_STEPS, Step, parse_delay
from sendqueue.services.importing.recipients import Templates

__all__ = ["STEP_FIELDS", "form_steps"]

#: The fields of one later step's slot, as the form names them after ``steps[k].``.
STEP_FIELDS = ("after", "subject", "text", "html", "new_thread")

TextField = Callable[[FormData, str], str | None]
FlagField = Callable[[FormData, str], bool]


def form_steps(
    form: FormData, first: Templates, *, text: TextField, flag: FlagField
) -> list[Step] | None:
    """The steps the form holds, step 1 made of ``first``; None when no later step is filled
    (a campaign of one email). ``text`` and ``flag`` read one field as the rest of the form
    is read. Errors name ``steps[k].field``."""
    filled: dict[int, dict[str, str | bool | None]] = {}
    for k in range(2, MAX_STEPS + 1):
        values: dict[str, str | bool | None] = {
            name: text(form, f"steps[{k}].{name}") for name in STEP_FIELDS[:4]
        }
        values["new_thread"] = flag(form, f"steps[{k}].new_thread")
        if any(values.values()):
            filled[k] = values
    if not filled:
        return None
    last = max(filled)
    for k in range(2, last):
        if k not in filled:
            raise InvalidField(
                f"steps[{k}].text", None,
                f"step {k} is empty while step {last} is filled: fill the steps in order",
            )  # fmt: skip
    if not first.body:
        raise InvalidField("steps[1].text", None, "a sequence needs step 1's body template")
    steps = [Step(1, first.subject, first.body, first.html, None)]
    for k in range(2, last + 1):
        values = filled[k]
        after = values["after"]
        if not isinstance(after, str):
            raise InvalidField(
                f"steps[{k}].after", None, "give the wait after the previous step: 3d, 4h or 30m"
            )
        body = values["text"]
        steps.append(
            Step(
                k,
                _optional(values["subject"]),
                body if isinstance(body, str) else "",
                _optional(values["html"]),
                parse_delay(after, f"steps[{k}].after"),
                new_thread=values["new_thread"] is True,
            )
        )
    return steps


def _optional(value: str | bool | None) -> str | None:
    return value if isinstance(value, str) else None
