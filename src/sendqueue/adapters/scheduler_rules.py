"""The rules every Scheduler adapter shares: what a valid schedule is, and when it is due.

EventBridge Scheduler is the strictest execution layer sendqueue targets, so its limits are the
limits of every adapter: a schedule that the embedded layer accepts must also be accepted on AWS.

- Names and groups: 1..64 characters of ``[0-9a-zA-Z-_.]``.
- Client tokens: 1..64 characters of ``[a-zA-Z0-9-_]`` (no dot).
- ``max_retries``: 0..185 (EventBridge's ``MaximumRetryAttempts``).
- ``at_local``: a naive wall-clock time, read in ``timezone`` (an IANA name).
- ``payload``: a mapping of strings to strings.

Wall-clock to UTC (:func:`due_at`): a time the clocks show twice (the repeated hour when DST
ends) means its first occurrence, unless ``at_local`` carries ``fold=1``, Python's mark of the
second one, which ``astimezone`` sets for an instant of the repeated hour's second pass: the
schedule writer's wall times keep it, so a send planned then is not moved an hour early.
(EventBridge's ``at()`` expression cannot carry the mark.) A time the clocks skip (the hour
lost when DST starts), whatever its fold, means the end of the gap, the first instant that
exists after it: 02:30 on the night Europe/Berlin jumps from 02:00 to 03:00 is due at 03:00
local. Moving forward, never back, means a send never happens earlier than the time it was
asked for.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.policy import load_timezone
from sendqueue.ports import DueArgs, Schedule

__all__ = [
    "MAX_RETRIES_LIMIT",
    "CheckedDue",
    "build_due_schedules",
    "build_schedule",
    "check_at_local",
    "check_due_at",
    "check_due_many",
    "check_group",
    "check_limit",
    "check_max_retries",
    "check_name",
    "check_payload",
    "check_token",
    "due_at",
    "error_text",
    "local_now",
    "retry_delay",
    "wall_time",
]

MAX_RETRIES_LIMIT = 185
_NAME = re.compile(r"[0-9a-zA-Z_.\-]{1,64}")
_TOKEN = re.compile(r"[a-zA-Z0-9_\-]{1,64}")
_ERROR_TEXT_LIMIT = 2000


def _check_pattern(value: object, field: str, pattern: re.Pattern[str], allowed: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidField(field, value, f"expected 1 to 64 characters of {allowed}")
    return value


def check_name(value: object) -> str:
    """A valid schedule name, or InvalidField("name")."""
    return _check_pattern(value, "name", _NAME, "[0-9a-zA-Z-_.]")


def check_group(value: object) -> str:
    """A valid schedule group, or InvalidField("group")."""
    return _check_pattern(value, "group", _NAME, "[0-9a-zA-Z-_.]")


def check_token(value: object) -> str:
    """A valid client token, or InvalidField("client_token")."""
    return _check_pattern(value, "client_token", _TOKEN, "[a-zA-Z0-9-_]")


def check_max_retries(value: object) -> int:
    """``max_retries`` within EventBridge's 0..185, or InvalidField("max_retries")."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField("max_retries", value, "expected a whole number")
    if not 0 <= value <= MAX_RETRIES_LIMIT:
        raise InvalidField("max_retries", value, f"expected 0 to {MAX_RETRIES_LIMIT}")
    return value


def check_at_local(value: object) -> datetime:
    """A naive wall-clock datetime, or InvalidField("at_local")."""
    if not isinstance(value, datetime):
        raise InvalidField("at_local", value, "expected a datetime")
    if value.tzinfo is not None:
        raise InvalidField(
            "at_local", value, "expected a naive wall-clock time; the zone goes in timezone"
        )
    return value


def check_due_at(value: object) -> datetime:
    """An aware datetime as the same instant in UTC, or InvalidField("due_at")."""
    if not isinstance(value, datetime):
        raise InvalidField("due_at", value, "expected a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidField("due_at", value, "expected an aware instant (UTC)")
    return value.astimezone(UTC)


def check_payload(value: object) -> dict[str, str]:
    """A copy of ``value`` as a dict of str to str, or InvalidField("payload")."""
    if not isinstance(value, Mapping):
        raise InvalidField("payload", value, "expected a mapping of strings to strings")
    out: dict[str, str] = dict(value)
    for key, item in out.items():
        # type() first: a call of isinstance per key and value was most of this check's time.
        if (type(key) is not str or type(item) is not str) and not (
            isinstance(key, str) and isinstance(item, str)
        ):
            raise InvalidField("payload", out, "keys and values must be strings")
    return out


def check_limit(value: object) -> int:
    """A page size of at least 1, or InvalidField("limit")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidField("limit", value, "expected a whole number of at least 1")
    return value


def due_at(at_local: datetime, timezone: str) -> datetime:
    """The aware UTC instant of wall-clock ``at_local`` in ``timezone``.

    Repeated wall times resolve to their first occurrence (the second with ``fold=1``);
    skipped ones to the end of the gap (see the module docstring). Raises InvalidField for an
    aware ``at_local`` or an unknown ``timezone``.
    """
    check_at_local(at_local)
    return _due_in(at_local, load_timezone(timezone, "timezone"))


def _due_in(at_local: datetime, zone: ZoneInfo) -> datetime:
    """:func:`due_at` of a checked ``at_local`` in a loaded ``zone``."""
    # Both readings of the wall time, fold=0 and fold=1, whatever fold at_local carries. (The
    # constructor and combine(), not replace(): datetime.replace costs 0.7 us a call, half of
    # this path, and provisioning converts a hundred thousand of these.)
    fields = (
        at_local.year, at_local.month, at_local.day,
        at_local.hour, at_local.minute, at_local.second, at_local.microsecond,
    )  # fmt: skip
    offset = zone.utcoffset(datetime(*fields) if at_local.fold else at_local)
    if offset is not None and zone.utcoffset(datetime(*fields, fold=1)) == offset:
        # Both readings agree: no transition near this wall time, so it exists exactly once.
        # (The common case, and a third of the cost of the round trip below.)
        return datetime.combine(at_local.date(), at_local.time(), UTC) - offset
    # Near a transition: the reading of at_local's own fold (a repeated time's first showing,
    # or its second with fold=1), if the clocks show that wall time at all.
    instant = at_local.replace(tzinfo=zone).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == at_local:
        return instant
    return _gap_end(at_local, zone)


def _gap_end(at_local: datetime, zone: ZoneInfo) -> datetime:
    # In a gap, fold=0 reads the wall time with the offset before the transition (landing after
    # it) and fold=1 with the offset after it (landing before it). The transition lies between
    # the two; find its second by bisection (transitions fall on whole seconds).
    one = at_local.replace(tzinfo=zone, fold=0).timestamp()
    two = at_local.replace(tzinfo=zone, fold=1).timestamp()
    low, high = math.floor(min(one, two)), math.ceil(max(one, two))
    after = datetime.fromtimestamp(high, zone).utcoffset()
    while high - low > 1:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == after:
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, UTC)


def local_now(now: datetime, timezone: str) -> datetime:
    """``now`` (aware) as naive wall-clock time in ``timezone``."""
    return now.astimezone(load_timezone(timezone, "timezone")).replace(tzinfo=None)


def build_schedule(
    name: str,
    group: str,
    at_local: datetime,
    timezone: str,
    payload: Mapping[str, str],
    client_token: str,
    max_retries: int,
    *,
    created_at: datetime,
) -> Schedule:
    """Check every argument of ``Scheduler.create`` and build the new schedule, due at
    :func:`due_at` of its wall time.

    Raises InvalidField naming the first bad field, in signature order.
    """
    name = check_name(name)
    group = check_group(group)
    at_local = check_at_local(at_local)
    due = _due_in(at_local, load_timezone(timezone, "timezone"))
    checked = check_payload(payload)
    client_token = check_token(client_token)
    max_retries = check_max_retries(max_retries)
    return Schedule(
        name, group, at_local, timezone, checked, client_token, due, max_retries, 0, created_at
    )


#: ``create_many``'s item checked: name, group, the wall-clock time in its zone (aware: the
#: instant read in ``timezone``, its ``fold`` set on a repeated hour's second pass), timezone,
#: payload (copied into a dict of strings), client token, max_retries, and the instant in UTC.
CheckedDue = tuple[str, str, datetime, str, dict[str, str], str, int, datetime]


def check_due_many(items: Iterable[DueArgs]) -> list[CheckedDue]:
    """Check every item of a bulk write (``BulkScheduler.create_many``: ``create``'s arguments
    with the instant the schedule is due in place of ``at_local``) as ``create`` checks its
    arguments, in order, and read each instant in its zone.

    No wall time is read back into an instant: the instant is given, so a schedule due in a
    repeated or skipped hour needs no rule (:func:`due_at`'s). Raises InvalidField naming the
    first bad field of the first bad item (``due_at`` for an instant that is not an aware
    datetime). The fields a chunk shares (its group, timezone and ``max_retries``) are checked
    once per distinct value.
    """
    groups: set[str] = set()
    retries: set[int] = set()
    zones: dict[str, ZoneInfo] = {}
    name_ok, token_ok = _NAME.fullmatch, _TOKEN.fullmatch
    out: list[CheckedDue] = []
    for name, group, due, timezone, payload, client_token, max_retries in items:
        # The common valid case inline; the check_* functions raise for anything else.
        if type(name) is not str or name_ok(name) is None:
            name = check_name(name)
        if not isinstance(group, str) or group not in groups:
            groups.add(check_group(group))
        if type(due) is not datetime or due.tzinfo is not UTC:
            due = check_due_at(due)
        zone = zones.get(timezone) if type(timezone) is str else None
        if zone is None:
            zone = zones[timezone] = load_timezone(timezone, "timezone")
        checked = check_payload(payload)
        if type(client_token) is not str or token_ok(client_token) is None:
            client_token = check_token(client_token)
        if type(max_retries) is not int or max_retries not in retries:
            retries.add(check_max_retries(max_retries))
        out.append(
            (name, group, due.astimezone(zone), timezone, checked, client_token, max_retries, due)
        )
    return out


def wall_time(local: datetime) -> datetime:
    """The naive wall-clock time (``Schedule.at_local``) of an aware ``local`` time, its fold
    kept (combine() is cheaper than replace(tzinfo=None))."""
    return datetime.combine(local.date(), local.time())


def build_due_schedules(items: Iterable[DueArgs], *, created_at: datetime) -> list[Schedule]:
    """The schedules of a bulk write's items (:func:`check_due_many`), in order."""
    return [
        Schedule(name, group, wall_time(local), zone, payload, token, due, retries, 0, created_at)
        for name, group, local, zone, payload, token, retries, due in check_due_many(items)
    ]


def retry_delay(
    attempt: int, base: float, cap: float, rng: random.Random | None = None
) -> timedelta:
    """The wait before retry number ``attempt`` (1-based): exponential, capped, jittered.

    The ceiling doubles from ``base`` up to ``cap``; the delay is drawn from its upper half
    ("equal jitter"), so retries of many schedules that failed together spread out without
    any of them retrying almost at once.
    """
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    draw = (rng or random).random()
    return timedelta(seconds=ceiling / 2 + draw * ceiling / 2)


def error_text(exc: BaseException) -> str:
    """A one-line description of a failed invocation, short enough to store."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[: _ERROR_TEXT_LIMIT - 1] + "…"
