"""A sequence's funnel: what became of each step's emails. Pure, no I/O.

Fed by counts of a campaign's tasks per ``(step, state, outcome)``, whatever reads them (a
pass over the tasks, or a store's grouped count), so the source can change without the
pages noticing. A later step's email exists once the step before it was sent to that
recipient, so a step counts the emails made so far.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .lifecycle import TaskOutcome, TaskState

__all__ = ["STOPPING_OUTCOMES", "StepCounts", "StepFunnel", "step_funnel"]

#: Tasks of a campaign per (step, state, outcome); outcome None until sent.
StepCounts = Mapping[tuple[int, TaskState, TaskOutcome | None], int]

#: Outcomes of a sent email that stop its recipient's sequence, besides a reply.
STOPPING_OUTCOMES = frozenset(
    {TaskOutcome.BOUNCED, TaskOutcome.UNSUBSCRIBED, TaskOutcome.COMPLAINED}
)


@dataclass(frozen=True)
class StepFunnel:
    """One step's emails: ``made`` (every one, whatever its state); ``sent`` (Finished,
    whatever came back), of them ``answered``
    (replied); ``stopped`` (cancelled, or sent and bounced, unsubscribed or complained about);
    ``pending`` (Pending or Running); ``failed``."""

    step: int
    made: int = 0
    sent: int = 0
    answered: int = 0
    stopped: int = 0
    pending: int = 0
    failed: int = 0


def step_funnel(steps: int, counts: StepCounts) -> tuple[StepFunnel, ...]:
    """Steps 1 to ``steps`` (and any later step that has emails) with what became of their
    emails, in step order."""
    tallies: dict[int, dict[str, int]] = {k: {} for k in range(1, max(steps, 1) + 1)}
    for (step, state, outcome), n in counts.items():
        tally = tallies.setdefault(step, {})
        for name in ("made", *_kinds(state, outcome)):
            tally[name] = tally.get(name, 0) + n
    return tuple(StepFunnel(step, **tallies[step]) for step in sorted(tallies))


def _kinds(state: TaskState, outcome: TaskOutcome | None) -> tuple[str, ...]:
    """Which of a funnel's counts one email adds to."""
    if state is TaskState.FINISHED:
        if outcome is TaskOutcome.REPLIED:
            return ("sent", "answered")
        if outcome in STOPPING_OUTCOMES:
            return ("sent", "stopped")
        return ("sent",)
    if state is TaskState.CANCELLED:
        return ("stopped",)
    if state is TaskState.FAILED:
        return ("failed",)
    return ("pending",)
