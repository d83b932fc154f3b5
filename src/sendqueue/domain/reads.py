"""What the read side gets from the store in one call: a campaign with its figures, a page of its
tasks with the senders they name, both together for the campaign page, and one task with its
campaign and sender for the email page.

Built by :class:`sendqueue.ports.reads.CampaignReads`; read by
:class:`sendqueue.services.reading.queries.Queries`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.senders import Sender

__all__ = [
    "CampaignFigures",
    "CampaignPage",
    "StepCounts",
    "TaskDetail",
    "TaskListing",
    "whole_positions",
]


@dataclass(frozen=True, slots=True)
class StepCounts:
    """One step's tasks of a campaign per state (every state named) and its sent emails per
    outcome (only the outcomes it has)."""

    counts: Mapping[TaskState, int]
    outcomes: Mapping[TaskOutcome, int]

    @classmethod
    def tally(
        cls, found: Iterable[tuple[int, TaskState, TaskOutcome | None, int]]
    ) -> dict[int, StepCounts]:
        """Per step, from ``(step, state, outcome, count)`` rows, as a store's GROUP BY gives
        them (a step and state may come in several rows, one per outcome)."""
        counts: dict[int, dict[TaskState, int]] = {}
        outcomes: dict[int, dict[TaskOutcome, int]] = {}
        for step, state, outcome, n in found:
            per_state = counts.setdefault(step, dict.fromkeys(TaskState, 0))
            per_state[state] += n
            if outcome is not None:
                per_outcome = outcomes.setdefault(step, {})
                per_outcome[outcome] = per_outcome.get(outcome, 0) + n
        return {step: cls(counts[step], outcomes.get(step, {})) for step in sorted(counts)}


@dataclass(frozen=True, slots=True)
class CampaignFigures:
    """A campaign and what its views count: tasks per state (every state named), moved and late
    emails, emails cancelled as suppressed, sent emails per outcome, and its next send (None
    unless it is sending). ``changed`` says whether its change log has entries after the
    ``changes_since`` the read was asked about (None when it was not asked). ``steps``: the counts
    per step number, of the steps that have tasks (None when the read was not asked for them)."""

    campaign: Campaign
    counts: Mapping[TaskState, int]
    moved: int
    late: int
    suppressed: int
    outcomes: Mapping[TaskOutcome, int]
    next_send_at: datetime | None
    changed: bool | None = None
    steps: Mapping[int, StepCounts] | None = None


@dataclass(frozen=True, slots=True)
class TaskListing:
    """A page of a campaign's tasks in position order and the senders they and the campaign
    name, by id (a removed sender is absent). ``more`` says whether tasks follow the page."""

    campaign: Campaign
    tasks: Sequence[Task]
    more: bool
    senders: Mapping[str, Sender] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CampaignPage:
    """Everything the campaign page shows from the store: ``last_change_id`` (read first, so a
    stream resuming after it misses no change made while the rest was read), the figures and
    a page of tasks."""

    last_change_id: int
    figures: CampaignFigures
    listing: TaskListing


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """One task of a campaign and the sender it names, by id (empty when it names none or the
    sender was removed). ``task`` is None when the campaign has no task of that id."""

    campaign: Campaign
    task: Task | None
    senders: Mapping[str, Sender] = field(default_factory=dict)


def whole_positions(tasks: Sequence[Task], *, more: bool, sequence: bool) -> list[Task]:
    """A page of tasks read in position order. In a ``sequence`` (a campaign of more than one
    step, listed without a step filter) each recipient's steps come in step order and, when
    more follow, the last position's tasks are left out if others remain: the page may have
    cut that recipient's steps, and the next page starts after the last position shown."""
    if not sequence:
        return list(tasks)
    ordered = sorted(tasks, key=lambda t: (t.position, t.step))
    if more and ordered and ordered[0].position != ordered[-1].position:
        last = ordered[-1].position
        return [t for t in ordered if t.position != last]
    return ordered
