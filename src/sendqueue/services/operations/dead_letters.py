"""The dead-letter queue as the CLI and the API act on it.

A redrive removes a letter from the queue, the outbox its ``dead_letter`` event is relayed
from (:mod:`sendqueue.services.webhooks.dead_letters`). So every redrive relays the letters
first and removes them only once that has succeeded: a letter no relay run met yet still gets
its event, and a store that is down stops the redrive (its schedule would fail again anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sendqueue.domain.errors import NotFound
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import Schedule, Scheduler

__all__ = ["DeadLetterQueue", "RedriveReport", "Relay", "redrive_all", "redrive_one"]

#: Copies letters into the change log before they leave the queue
#: (:meth:`~sendqueue.services.webhooks.DeadLetterRelay.relay`).
Relay = Callable[[Sequence[DeadLetter]], object]


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


def redrive_one(scheduler: Scheduler, letter_id: str, *, relay: Relay) -> Schedule:
    """Relay the letter into the change log, then turn it back into a schedule due now.
    NotFound if there is no such letter."""
    letter = scheduler.dead_letter(letter_id)
    if letter is None:
        raise NotFound("dead letter", letter_id)
    relay([letter])
    return scheduler.redrive(letter_id)


def redrive_all(
    scheduler: Scheduler,
    *,
    relay: Relay,
    page: int = 1000,
    on_redriven: Callable[[str, str], None] | None = None,
) -> RedriveReport:
    """Redrive every dead letter, page after page, each schedule at most once per pass; each
    page is relayed into the change log before any of its letters is redriven.

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
        relay(fresh)
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


class DeadLetterQueue:
    """The queue's redrives with the container's relay (the CLI's, the API's and the pages')."""

    def __init__(self, scheduler: Scheduler, relay: Relay) -> None:
        self._scheduler = scheduler
        self._relay = relay

    def letters(self, *, limit: int = 1000) -> list[DeadLetter]:
        """The dead letters, as the scheduler lists them."""
        return self._scheduler.dead_letters(limit=limit)

    def redrive(self, letter_id: str) -> Schedule:
        """:func:`redrive_one`."""
        return redrive_one(self._scheduler, letter_id, relay=self._relay)

    def redrive_all(
        self, *, page: int = 1000, on_redriven: Callable[[str, str], None] | None = None
    ) -> RedriveReport:
        """:func:`redrive_all`."""
        return redrive_all(self._scheduler, relay=self._relay, page=page, on_redriven=on_redriven)
