"""Tasks with the least content, to fill a store in tests and benchmarks."""

from __future__ import annotations

from datetime import datetime

from sendqueue.domain.models import Task, task_id

__all__ = ["bare_task"]


def bare_task(campaign_id: str, position: int, send_at: datetime) -> Task:
    """The Pending task of ``campaign_id`` at ``position``, due at ``send_at``: address
    ``r<position>@example.com``, token ``tok<position>``, no name, a one-letter subject and
    text."""
    return Task(
        id=task_id(campaign_id, position),
        campaign_id=campaign_id,
        position=position,
        email=f"r{position}@example.com",
        name="",
        subject="s",
        text="t",
        html=None,
        send_at=send_at,
        token=f"tok{position}",
    )
