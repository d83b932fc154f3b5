"""The steps of a sequence: a campaign's ordered emails to each recipient. Pure, no I/O.

Step 1 is the campaign's first email. Every later step waits a :class:`Delay` after the
previous step was actually sent to that recipient: ``3d`` is three *sending days* of the
campaign's policy, ``4h`` and ``30m`` are elapsed time (:mod:`sendqueue.domain.followups` turns
a delay into an instant). A later step without a subject goes out as ``Re: <step 1's
subject>`` (:func:`follow_up_subject`) and, unless it starts a new thread, replies to the
earlier steps (:func:`thread_headers`, RFC 5322 section 3.6.4).

Errors name the field as ``steps[k].field``, ``k`` being the step's number (1-based).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from .errors import InvalidField

__all__ = [
    "MAX_STEPS",
    "Delay",
    "DelayUnit",
    "Step",
    "check_steps",
    "follow_up_subject",
    "parse_delay",
    "shown_value",
    "steps_from_data",
    "steps_to_data",
    "thread_headers",
]

#: Most steps a sequence may have, the first one included.
MAX_STEPS = 10
#: Longest delay: 60 sending days, or 60 days' worth of hours or minutes.
MAX_DELAY_DAYS = 60

_SHOWN_CHARS = 200
_DELAY_FORMS = "expected a delay such as 3d (sending days), 4h or 30m (elapsed time)"
_DELAY = re.compile(r"\s*([0-9]+)\s*([dhm])\s*", re.IGNORECASE)
_NEGATIVE = re.compile(r"\s*[-\u2212]\s*[0-9]+\s*[dhm]?\s*", re.IGNORECASE)
_NUMBER_ONLY = re.compile(r"\s*[0-9]+\s*")
# "Re:", "RE :", "re:" at the start: the subject already reads as a reply.
_REPLY_PREFIX = re.compile(r"re\s*:", re.IGNORECASE)
# RFC 5322 3.6.4 msg-id: "<" id-left "@" id-right ">", printable ASCII without spaces. Anything
# else (a line break above all) must never reach a header.
_MESSAGE_ID = re.compile(r"<[\x21-\x3b\x3d\x3f-\x7e]+@[\x21-\x3b\x3d\x3f-\x7e]+>")


class DelayUnit(enum.StrEnum):
    """What a delay counts: sending days of the policy, or elapsed hours or minutes."""

    DAYS = "days"
    HOURS = "hours"
    MINUTES = "minutes"

    @property
    def letter(self) -> str:
        """The unit as a delay is written: ``d``, ``h`` or ``m``."""
        return self.value[0]


_UNIT_OF_LETTER = {unit.letter: unit for unit in DelayUnit}
_MAX_AMOUNT = {
    DelayUnit.DAYS: MAX_DELAY_DAYS,
    DelayUnit.HOURS: MAX_DELAY_DAYS * 24,
    DelayUnit.MINUTES: MAX_DELAY_DAYS * 24 * 60,
}


@dataclass(frozen=True)
class Delay:
    """How long a step waits after the previous one was sent: ``amount`` of ``unit``.

    Days are sending days of the policy; hours and minutes are elapsed time (:attr:`elapsed`).
    """

    amount: int
    unit: DelayUnit

    def __post_init__(self) -> None:
        if not isinstance(self.unit, DelayUnit):
            raise InvalidField("after", shown_value(self.unit), "expected a DelayUnit")
        _check_amount(self.amount, self.unit, "after")

    @property
    def text(self) -> str:
        """The delay as it is written (``3d``, ``4h``, ``30m``); :func:`parse_delay` reads it."""
        return f"{self.amount}{self.unit.letter}"

    @property
    def elapsed(self) -> timedelta | None:
        """The time that must pass, for hours and minutes; None for sending days, whose length
        depends on the policy's calendar."""
        if self.unit is DelayUnit.HOURS:
            return timedelta(hours=self.amount)
        if self.unit is DelayUnit.MINUTES:
            return timedelta(minutes=self.amount)
        return None

    def __str__(self) -> str:
        return self.text


def parse_delay(text: object, field_name: str = "after") -> Delay:
    """``"3d"``, ``"4h"`` or ``"30m"`` (spaces around and between allowed, any case) -> a
    :class:`Delay`. Zero, negative, unitless, too long or other input raises
    :class:`InvalidField` naming ``field_name`` (such as ``steps[2].after``)."""
    if not isinstance(text, str):
        raise InvalidField(field_name, shown_value(text), f"{_DELAY_FORMS}, written as text")
    match = _DELAY.fullmatch(text)
    if match is None:
        if _NEGATIVE.fullmatch(text):
            reason = "a delay must be positive; the step waits after the previous one"
        elif _NUMBER_ONLY.fullmatch(text):
            n = text.strip()[:12]
            reason = f"give a unit, such as {n}d (sending days), {n}h or {n}m (elapsed)"
        else:
            reason = _DELAY_FORMS
        raise InvalidField(field_name, shown_value(text), reason)
    digits, letter = match.groups()
    unit = _UNIT_OF_LETTER[letter.lower()]
    # a few digits more than any allowed amount: int() of a huge digit string is costly
    if len(digits.lstrip("0")) > 9:
        _out_of_range(field_name, text, unit)
    amount = int(digits)
    _check_amount(amount, unit, field_name, shown=text)
    return Delay(amount, unit)


def _check_amount(amount: object, unit: DelayUnit, field_name: str, shown: object = None) -> None:
    """InvalidField unless ``amount`` is a whole number from 1 to the unit's maximum."""
    shown = amount if shown is None else shown
    # bool is an int subclass: True would pass for 1
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidField(field_name, shown_value(shown), "expected a whole number")
    if amount < 1:
        raise InvalidField(
            field_name, shown_value(shown), "a delay must be at least 1 (1d, 1h, 1m)"
        )
    if amount > _MAX_AMOUNT[unit]:
        _out_of_range(field_name, shown, unit)


def _out_of_range(field_name: str, shown: object, unit: DelayUnit) -> None:
    most = _MAX_AMOUNT[unit]
    limit = (
        f"{most} sending days"
        if unit is DelayUnit.DAYS
        else f"{most} {unit.value} ({MAX_DELAY_DAYS} days)"
    )
    raise InvalidField(field_name, shown_value(shown), f"at most {limit}")


@dataclass(frozen=True)
class Step:
    """One email of a sequence, for every recipient.

    ``number`` counts from 1. ``subject``, ``text`` and ``html`` are template sources (the
    same sandboxed templates as a campaign's); a later step without a subject goes out as
    ``Re: <step 1's subject>``. ``after`` is the wait after the previous step (None for step
    1). ``new_thread`` sends it without In-Reply-To and References. Single steps are checked
    here; :func:`check_steps` checks a sequence as a whole.
    """

    number: int
    subject: str | None
    text: str
    html: str | None
    after: Delay | None
    new_thread: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 1:
            raise InvalidField(
                "steps.number", shown_value(self.number), "steps are numbered from 1"
            )
        where = f"steps[{self.number}]"
        if self.subject is not None:
            _check_source(f"{where}.subject", self.subject, "leave it out to reply with Re:")
        _check_source(f"{where}.text", self.text, "give the step a text body")
        if self.html is not None:
            _check_source(f"{where}.html", self.html, "leave it out to send text only")
        if self.after is not None and not isinstance(self.after, Delay):
            raise InvalidField(f"{where}.after", shown_value(self.after), "expected a Delay")
        if not isinstance(self.new_thread, bool):
            raise InvalidField(f"{where}.new_thread", shown_value(self.new_thread), "true or false")


def _check_source(field_name: str, value: object, hint: str) -> None:
    if not isinstance(value, str):
        raise InvalidField(field_name, shown_value(value), "expected text (a template)")
    if not value.strip():
        raise InvalidField(field_name, value, f"empty; {hint}")


def check_steps(steps: Sequence[Step]) -> tuple[Step, ...]:
    """The steps of a sequence, checked as a whole: 1 to :data:`MAX_STEPS` steps numbered 1..n
    in order; step 1 has a subject, no ``after`` and starts the thread; every later step has
    an ``after``. Raises :class:`InvalidField` naming ``steps`` or ``steps[k].field``."""
    if isinstance(steps, str | bytes) or not isinstance(steps, Sequence):
        raise InvalidField("steps", shown_value(steps), "expected a list of steps")
    if not 1 <= len(steps) <= MAX_STEPS:
        raise InvalidField("steps", len(steps), f"a sequence has 1 to {MAX_STEPS} steps")
    for k, step in enumerate(steps, 1):
        where = f"steps[{k}]"
        if not isinstance(step, Step):
            raise InvalidField(where, shown_value(step), "expected a Step")
        if step.number != k:
            raise InvalidField(
                f"{where}.number", step.number, f"steps are numbered 1 to {len(steps)} in order"
            )
        if k == 1:
            _check_first(step)
        elif step.after is None:
            raise InvalidField(
                f"{where}.after", None, "give the wait after the previous step: 3d, 4h or 30m"
            )
    return tuple(steps)


def _check_first(step: Step) -> None:
    if step.subject is None:
        raise InvalidField(
            "steps[1].subject", None, "step 1 needs a subject; later steps reply to it with Re:"
        )
    if step.after is not None:
        raise InvalidField(
            "steps[1].after", step.after.text, "step 1 has no delay; it goes out as planned"
        )
    if step.new_thread:
        raise InvalidField("steps[1].new_thread", True, "step 1 always starts the thread")


def follow_up_subject(first_subject: str) -> str:
    """The subject of a later step that has none: ``Re: <first_subject>``, or the subject as
    it is when it already starts with ``Re:`` (any case), so replies never read ``Re: Re:``.
    Surrounding whitespace is dropped. Works on a template source or a rendered subject."""
    if not isinstance(first_subject, str) or not first_subject.strip():
        raise InvalidField("subject", shown_value(first_subject), "expected step 1's subject")
    subject = first_subject.strip()
    return subject if _REPLY_PREFIX.match(subject) else f"Re: {subject}"


def thread_headers(earlier_message_ids: Sequence[str]) -> dict[str, str]:
    """The headers that make a step reply to the earlier ones (RFC 5322 section 3.6.4):
    ``In-Reply-To`` the last Message-ID, ``References`` all of them in order, space separated.

    Each id must be a msg-id such as ``<abc@example.com>``; InvalidField names
    ``message_ids[i]`` (1-based, so ``message_ids[1]`` is step 1's) or ``message_ids``.
    """
    if isinstance(earlier_message_ids, str | bytes) or not isinstance(
        earlier_message_ids, Sequence
    ):
        raise InvalidField(
            "message_ids", shown_value(earlier_message_ids), "expected a list of ids"
        )
    if not earlier_message_ids:
        raise InvalidField("message_ids", [], "a reply needs the Message-ID of an earlier step")
    for i, message_id in enumerate(earlier_message_ids, 1):
        if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
            raise InvalidField(
                f"message_ids[{i}]",
                shown_value(message_id),
                "expected a Message-ID as <left@right>",
            )
    return {
        "In-Reply-To": earlier_message_ids[-1],
        "References": " ".join(earlier_message_ids),
    }


def shown_value(value: object) -> object:
    """A value as an error may quote it: short text and numbers as they are, long text cut,
    anything else by its type (the repr of what a YAML alias builds can be enormous)."""
    if isinstance(value, str):
        return value if len(value) <= _SHOWN_CHARS else f"{value[:_SHOWN_CHARS]}..."
    # an int past 64 bits is shown by its type: printing a huge one is slow, then refused
    if (
        value is None
        or isinstance(value, float)
        or (isinstance(value, int) and value.bit_length() <= 64)
    ):
        return value
    return f"<{type(value).__name__}>"


def steps_to_data(steps: Sequence[Step]) -> list[dict[str, object]]:
    """The steps as JSON-ready mappings, in order (:func:`steps_from_data` reads them back)."""
    return [
        {
            "subject": step.subject,
            "text": step.text,
            "html": step.html,
            "after": None if step.after is None else step.after.text,
            "new_thread": step.new_thread,
        }
        for step in steps
    ]


def steps_from_data(data: object) -> tuple[Step, ...]:
    """Stored steps (:func:`steps_to_data`), numbered by their place and checked as a
    sequence; None or an empty list is a campaign made before its steps were stored."""
    if data is None or data == []:
        return ()
    if not isinstance(data, list) or not all(isinstance(entry, dict) for entry in data):
        raise InvalidField("steps", shown_value(data), "expected a list of stored steps")
    steps = []
    for k, entry in enumerate(data, 1):
        after = entry.get("after")
        delay = None if after is None else parse_delay(after, f"steps[{k}].after")
        steps.append(
            Step(
                k, entry.get("subject"), entry.get("text"), entry.get("html"), delay,
                bool(entry.get("new_thread", False)),
            )
        )  # fmt: skip
    return check_steps(steps)
