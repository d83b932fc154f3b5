"""A campaign's steps as its views show them: each step's delay, subject and thread, with its
tasks per state and sent emails per outcome (``campaign show``, ``GET /api/campaigns/{id}``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Campaign
from sendqueue.domain.reads import StepCounts
from sendqueue.domain.steps import Step, follow_up_subject

__all__ = ["StepView", "step_views"]

_NO_COUNTS = StepCounts(dict.fromkeys(TaskState, 0), {})


class StepView(BaseModel):
    """One step of a campaign's sequence with its counts."""

    model_config = ConfigDict(frozen=True)

    number: int = Field(description="1-based; step 1 is the campaign's first email")
    after: str | None = Field(
        description="the wait after the previous step (3d: sending days, 4h, 30m); null for step 1"
    )
    subject: str | None = Field(
        description="the subject template it goes out with (Re: <step 1's subject> for a later "
        "step without its own); null when each recipient's row carries its own"
    )
    new_thread: bool = Field(description="sent without In-Reply-To and References")
    counts: dict[str, int] = Field(description="its tasks per state, every state named")
    outcomes: dict[str, int] = Field(description="its sent emails per outcome, every one named")


def step_views(campaign: Campaign, counts: Mapping[int, StepCounts]) -> list[dict[str, Any]]:
    """The campaign's steps in order with ``counts`` (``TaskStore.count_steps``). A campaign
    stored without steps shows one step, from its counts; a step with tasks but no longer in
    the sequence shows with its counts alone."""
    defined = {step.number: step for step in campaign.steps}
    numbers = sorted({1, *defined, *counts})
    first = defined.get(1)
    return [
        _view(n, defined.get(n), first, counts.get(n, _NO_COUNTS)).model_dump(mode="json")
        for n in numbers
    ]


def _view(number: int, step: Step | None, first: Step | None, counts: StepCounts) -> StepView:
    subject = None
    if step is not None and step.subject is not None:
        subject = step.subject
    elif number > 1 and first is not None and first.subject is not None:
        subject = follow_up_subject(first.subject)
    return StepView(
        number=number,
        after=step.after.text if step is not None and step.after is not None else None,
        subject=subject,
        new_thread=step.new_thread if step is not None else False,
        counts={state.value: counts.counts.get(state, 0) for state in TaskState},
        outcomes={outcome.value: counts.outcomes.get(outcome, 0) for outcome in TaskOutcome},
    )
