"""The dead-letter queue as the CLI and the API act on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sendqueue.domain.errors import NotFound
from sendqueue.ports import Scheduler

__all__ = ["RedriveReport", "redrive_all"]


@dataclass
class RedriveReport:
    """What one redrive pass did.

    ``redriven`` and ``schedules`` pair up; ``skipped`` were redriven by someone else meanwhile;
    ``failed_again`` are new letters of schedules this pass already redrove (left in the queue).
    """

    redriven: list[str] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed_again: list[str] = field(default_factory=list)


def redrive_all(
    scheduler: Scheduler,
    *,
    page: int = 1000,
    on_redriven: Callable[[str, str], None] | None = None,
) -> RedriveReport:
    """Redrive every dead letter, page after page, each schedule at most once per pass.

    A letter someone else redrove meanwhile (NotFound) is skipped, not an error. A redriven
    schedule that fails again (the cause is not fixed yet) lands in the queue as a new letter;
    the pass leaves it there instead of redriving it again, so it always ends: every page is
    compared with the letters and schedules already handled. ``on_redriven(letter, schedule)``
    is called as each one goes, so a caller can show progress even if a later redrive raises.
    """
    report = RedriveReport()
    seen: set[str] = set()
    redriven_schedules: set[str] = set()
    while True:
        fresh = [d for d in scheduler.dead_letters(limit=page) if d.id not in seen]
        if not fresh:
            return report
        for letter in fresh:
            seen.add(letter.id)
            if letter.schedule_name in redriven_schedules:
                report.failed_again.append(letter.id)
                continue
            try:
                schedule = scheduler.redrive(letter.id)
            except NotFound:
                report.skipped.append(letter.id)
                continue
            redriven_schedules.add(letter.schedule_name)
            report.redriven.append(letter.id)
            report.schedules.append(schedule.name)
            if on_redriven is not None:
                on_redriven(letter.id, schedule.name)
