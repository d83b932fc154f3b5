"""Why emails moved: an outage's cause and window, and the short reason written on each email.

A catch-up re-plan (:mod:`sendqueue.services.planning.replanning`) moves a campaign's Pending emails
because something kept them from going out on time. The reason it writes on every moved email
(``moved_reason``) and in its one log line per campaign names that cause and when it lasted,
always in UTC, so one outage reads the same in every campaign, in the log and next to the
ISO times of the CLI and the API: ``worker down 16:50-17:48 UTC`` (an en dash in the text).

Pure: which cause applies is decided by :mod:`sendqueue.services.planning.recovery` from what its
process saw.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["Outage", "OutageCause", "utc_span"]


class OutageCause(enum.StrEnum):
    """What kept the emails from going out on time."""

    WORKER_DOWN = "worker down"
    """No worker (the execution layer of this process) ran: the sends were due before it
    started."""
    STORE_UNREACHABLE = "store unreachable"
    """The worker ran, but the task store failed while the sends were waiting."""
    FIRED_LATE = "fired late"
    """The execution layer fired the send late while the worker ran (a suspended host, an
    overloaded dispatcher, a retried or redriven invocation)."""
    NOT_FIRED = "not fired"
    """The reconciler found the send overdue: no fire had sent it (a lost or dead-lettered
    schedule, or a worker down that this process did not see)."""
    PAUSED = "paused"
    """The campaign was paused; a resume re-plans what it kept."""


@dataclass(frozen=True)
class Outage:
    """A cause and the window it lasted: ``since`` (the first send it kept from going out, or
    when it began) to ``until`` (when it ended or was found)."""

    cause: OutageCause
    since: datetime
    until: datetime

    @property
    def reason(self) -> str:
        """``"worker down 16:50-17:48 UTC"``: what a moved email's ``moved_reason`` says."""
        return f"{self.cause} {utc_span(self.since, self.until)}"


def utc_span(since: datetime, until: datetime) -> str:
    """``16:50-17:48 UTC`` (an en dash); with seconds when both ends fall in one minute; with
    dates when they fall on different UTC days. An end before its start is read as the start."""
    a = since.astimezone(UTC)
    b = max(until, since).astimezone(UTC)
    if a.date() != b.date():
        return f"{a:%Y-%m-%d %H:%M}\u2013{b:%Y-%m-%d %H:%M} UTC"
    if (a.hour, a.minute) == (b.hour, b.minute):
        return f"{a:%H:%M:%S}\u2013{b:%H:%M:%S} UTC"
    return f"{a:%H:%M}\u2013{b:%H:%M} UTC"
