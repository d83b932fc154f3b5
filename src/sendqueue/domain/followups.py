"""When a later step of a sequence may go out to a recipient. Pure, no I/O.

A step waits its :class:`~sendqueue.domain.steps.Delay` after the previous step was actually
sent to that recipient (``sent_at``), under the campaign's policy read in ``zone`` (the
recipient's, for a local-time campaign; the policy's own otherwise):

* ``Nd``: the start of the first window of the Nth sending day after the local date of
  ``sent_at``. A sending day is one the planner would send on
  (:mod:`sendqueue.domain.planner`): an allowed weekday, not a skip date, whose windows hold
  real time (a DST gap may swallow them). Sent on a Friday, ``1d`` under Mon-Fri is Monday's
  first window, wherever in Friday (or outside its windows) the previous step went out.
* ``Nh`` / ``Nm``: ``sent_at`` plus that much elapsed time (DST changes the wall clock, not
  the wait), then the earliest instant inside a window
  (:func:`~sendqueue.domain.planner.next_window_instant`): that instant itself when it is in
  one.

The day calendar is the planner's own (its exact window intervals, DST included), not a copy.
The result is the earliest moment the step is due: capacity and ``per_day`` are not looked at.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from .errors import InvalidField, NoSendingDay
from .planner import (
    PLANNING_HORIZON_DAYS,
    _exact_intervals,
    _no_sending_day_reason,
    next_window_instant,
)
from .policy import SendingPolicy, load_timezone
from .steps import Delay, shown_value

__all__ = ["first_instant_on", "follow_up_earliest"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = _EPOCH.date().toordinal()
_MAX_ORDINAL = datetime.max.date().toordinal()
_MS_DAY = 86_400_000


def follow_up_earliest(
    policy: SendingPolicy, sent_at: datetime, delay: Delay, zone: str | None = None
) -> datetime:
    """The earliest instant (aware, UTC, whole milliseconds) a step may go out when the
    previous step was sent at ``sent_at`` and the step waits ``delay`` (module docstring).

    ``zone`` is an IANA zone to read the policy's windows, weekdays and skip dates in (a
    local-time campaign's recipient); None reads them in the policy's timezone. Raises
    :class:`InvalidField` naming ``sent_at`` (naive, or the result past the year 9999),
    ``after`` or ``zone``; :class:`NoSendingDay` when :data:`PLANNING_HORIZON_DAYS` days in a
    row hold no sending day.
    """
    if not isinstance(sent_at, datetime) or sent_at.utcoffset() is None:
        raise InvalidField("sent_at", shown_value(sent_at), "expected an aware date and time")
    if not isinstance(delay, Delay):
        raise InvalidField("after", shown_value(delay), "expected a Delay: parse_delay('3d')")
    if zone is not None:
        load_timezone(zone, "zone")
        if zone != policy.timezone:
            policy = replace(policy, timezone=zone)
    try:
        elapsed = delay.elapsed
        if elapsed is not None:
            return next_window_instant(policy, sent_at.astimezone(UTC) + elapsed)
        return _sending_day_start(policy, sent_at, delay.amount)
    except OverflowError as exc:
        raise InvalidField(
            "sent_at",
            sent_at.isoformat(),
            f"{delay.text} later leaves the supported date range (years 1 to 9999)",
        ) from exc


def first_instant_on(policy: SendingPolicy, day: date, zone: str | None = None) -> datetime:
    """The first instant a step may go out on or after the local ``day`` (read in ``zone``,
    else the policy's timezone): the start of the first window of the first sending day from
    ``day`` on (an out-of-office notice's return date). Raises :class:`InvalidField` naming
    ``zone``, :class:`NoSendingDay` as the planner does."""
    if zone is not None:
        load_timezone(zone, "zone")
        if zone != policy.timezone:
            policy = replace(policy, timezone=zone)
    midnight = datetime.combine(day, time(0), tzinfo=policy.zone)
    return next_window_instant(policy, midnight.astimezone(UTC))


def _sending_day_start(policy: SendingPolicy, sent_at: datetime, days: int) -> datetime:
    """The start of the first window of the ``days``-th sending day after ``sent_at``'s local
    date. OverflowError past ``date.max``."""
    zone = policy.zone
    # whole milliseconds, rounded up, as the planner's intervals are
    sent_ms = -(-((sent_at.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)) // 1000)
    ordinal = sent_at.astimezone(zone).date().toordinal()
    allowed = tuple(d in policy.weekdays for d in range(7))
    skip = {d.toordinal() for d in policy.skip_dates}
    found = empty_run = 0
    while True:
        ordinal += 1
        if ordinal > _MAX_ORDINAL:
            raise OverflowError("past date.max")
        # date(1, 1, 1) has ordinal 1 and is a Monday
        sending = allowed[(ordinal - 1) % 7] and ordinal not in skip
        start = _first_window_ms(policy, zone, ordinal, sent_ms) if sending else None
        if start is None:
            empty_run += 1
            if empty_run >= PLANNING_HORIZON_DAYS:
                raise NoSendingDay(_no_sending_day_reason(policy, ordinal - empty_run + 1))
            continue
        empty_run = 0
        found += 1
        if found == days:
            return _EPOCH + timedelta(milliseconds=start)


def _first_window_ms(policy: SendingPolicy, zone: ZoneInfo, ordinal: int, after: int) -> int | None:
    """The start (ms) of the day's first window interval that ends after ``after``; None when
    the day holds no window time then. The instant ``after`` has an earlier local date, so it
    lies in none of them; but where a fall-back crosses midnight (America/Goose_Bay until 2010)
    the day's first wall times come before the repeated evening, and only later ones count."""
    day_ms = (ordinal - _EPOCH_ORDINAL) * _MS_DAY
    for start, end in _exact_intervals(zone, day_ms, policy.windows):
        if end > after:
            return start
    return None
