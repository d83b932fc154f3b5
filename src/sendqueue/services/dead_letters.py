"""The dead-letter queue as the CLI and the API act on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sendqueue.domain.errors import NotFound
from sendqueue.ports import Scheduler

__all__ = ["RedriveReport", "redrive_all"]


@dataclass
class RedriveReport:
    """What one redrive pass did: letters turned back into schedules, and those already gone."""

    redriven: list[str] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def redrive_all(scheduler: Scheduler, *, page: int = 1000) -> RedriveReport:
    """Redrive every dead letter, page after page, until a page brings no letter not seen yet.

    A letter that someone else redrove meanwhile (NotFound) is skipped, not an error. A letter
    that dead-letters again during the pass is seen under a new id only after this pass, since
    each page is compared with the ids already handled, so the pass always ends.
    """
    report = RedriveReport()
    seen: set[str] = set()
    while True:
        fresh = [d for d in scheduler.dead_letters(limit=page) if d.id not in seen]
        if not fresh:
            return report
        for letter in fresh:
            seen.add(letter.id)
            try:
                schedule = scheduler.redrive(letter.id)
            except NotFound:
                report.skipped.append(letter.id)
                continue
            report.redriven.append(letter.id)
            report.schedules.append(schedule.name)
