"""A sequence's steps as the campaign page shows them: each step's wait, subject and funnel
(:func:`~sendqueue.domain.funnel.step_funnel`), from counts per step, state and outcome."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sendqueue.domain.funnel import StepCounts, step_funnel
from sendqueue.domain.models import Campaign
from sendqueue.domain.steps import follow_up_subject
from sendqueue.web.schemas import FunnelStep

__all__ = ["funnel_out", "funnel_rows"]


def funnel_out(campaign: Campaign, counts: StepCounts) -> list[FunnelStep] | None:
    """A sequence's funnel as the API's campaign read returns it; None for one email."""
    if len(campaign.steps) < 2:
        return None
    return [FunnelStep(**asdict(f)) for f in step_funnel(len(campaign.steps), counts)]


def funnel_rows(campaign: Campaign, counts: StepCounts) -> list[dict[str, Any]]:
    """One row per step of a sequence (none for a campaign of one email): its number, wait,
    subject template (``Re: ...`` for a later step without one), the emails made so far,
    and of them sent, answered, stopped, pending and failed. ``widest``: step 1's emails
    made (at least 1), what each step's bar is drawn against."""
    steps = campaign.steps
    if len(steps) < 2:
        return []
    funnel = step_funnel(len(steps), counts)
    first_subject = steps[0].subject or ""
    widest = max(1, funnel[0].made)
    rows = []
    for f in funnel:
        step = steps[f.step - 1] if f.step <= len(steps) else None
        subject = "" if step is None else step.subject
        if step is not None and subject is None:
            subject = follow_up_subject(first_subject) if first_subject.strip() else ""
        rows.append(
            {
                "step": f.step,
                "wait": (step.after.text if step is not None and step.after else "as planned"),
                "subject": subject,
                "made": f.made,
                "widest": max(widest, f.made),
                "sent": f.sent,
                "answered": f.answered,
                "stopped": f.stopped,
                "pending": f.pending,
                "failed": f.failed,
            }
        )
    return rows
