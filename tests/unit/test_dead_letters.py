"""redrive_all: every page, letters gone meanwhile skipped, a pass that always ends."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from datetime import UTC, datetime

from sendqueue.domain.errors import NotFound
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import Schedule
from sendqueue.services.operations.dead_letters import redrive_all

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class StillFailing:
    """A dead-letter queue whose redriven schedules fail again at once (the store is still down),
    each landing as a new letter; ``gone`` letters were redriven by someone else."""

    def __init__(self, count: int, gone: set[str] | None = None) -> None:
        self.letters: dict[str, DeadLetter] = {}
        self.gone = gone or set()
        self.redrives = 0
        self._next = 0
        for i in range(count):
            self._add(f"sq-c1-{i}.0")

    def _add(self, schedule_name: str) -> None:
        self._next += 1
        letter_id = f"dl-{self._next}"
        self.letters[letter_id] = DeadLetter(
            id=letter_id,
            schedule_name=schedule_name,
            group="sq-c1",
            payload={"task_id": schedule_name},
            error="StoreUnavailable",
            attempts=3,
            failed_at=T0,
        )

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        return list(self.letters.values())[:limit]

    def redrive(self, dead_letter_id: str) -> Schedule:
        if dead_letter_id in self.gone:
            self.letters.pop(dead_letter_id)
            raise NotFound("dead letter", dead_letter_id)
        letter = self.letters.pop(dead_letter_id)
        self.redrives += 1
        self._add(letter.schedule_name)  # fired at once and failed again
        payload: Mapping[str, str] = letter.payload
        return Schedule(letter.schedule_name, letter.group, T0, "UTC", payload, "tok", T0)


def test_a_pass_ends_when_every_redriven_schedule_fails_again() -> None:
    queue = StillFailing(2_500, gone={"dl-7"})
    progress: list[tuple[str, str]] = []

    relayed: list[str] = []
    report = redrive_all(
        queue,  # type: ignore[arg-type]
        relay=lambda letters: relayed.extend(d.id for d in letters),
        on_redriven=lambda letter, name: progress.append((letter, name)),
    )

    assert queue.redrives == 2_499  # each schedule once, across three pages
    assert report.skipped == ["dl-7"]
    assert len(report.redriven) == len(report.schedules) == 2_499
    assert progress == list(zip(report.redriven, report.schedules, strict=True))
    # the new letters wait for the cause to be fixed; those the pass met are reported
    assert len(queue.letters) == 2_499
    assert report.failed_again and set(report.failed_again) <= set(queue.letters)
    # every letter this pass met was relayed (its dead_letter event) before it left the queue
    assert set(report.redriven) | set(report.skipped) <= set(relayed)
