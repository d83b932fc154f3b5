"""An email (task) as the pages show it: its row in the campaign's emails table, and every
field of it on its own page.

A row's texts are written here and, for rows the live stream redraws, by
``campaign_rows.js`` (``taskCells``) from the API's task: keep both in step. Times are in the
campaign's zone with its abbreviation (:func:`~sendqueue.web.times.human_time`); a local-time
campaign's rows add the recipient's own wall-clock time, named by the recipient's zone.
"""

from __future__ import annotations

from typing import Any

from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.sender_fields import SenderFields, fill_sender
from sendqueue.domain.wording import plural
from sendqueue.services.reading.views import TaskView
from sendqueue.web.times import human_time, zone_time

__all__ = ["email_url", "moved_text", "task_details", "task_row"]


def moved_text(moves: int, reason: str | None) -> str:
    """``"1 move: worker down 16:50-17:48 UTC"``; campaign_rows.js writes the same."""
    if not moves:
        return ""
    return f"{plural(moves, 'move')}: {reason or ''}".rstrip(": ")


def email_url(campaign_id: str, task_id: str) -> str:
    """The page of one email (every field of it)."""
    return f"/campaigns/{campaign_id}/emails/{task_id}"


def recipient_zone(task: Task, campaign: Campaign) -> str | None:
    """The zone a local-time campaign reads this email's windows in (its recipient's, else
    the campaign's); None for any other campaign."""
    return (task.timezone or campaign.policy.timezone) if campaign.local_time else None


def task_row(
    task: Task, campaign: Campaign, *, campaign_paused: bool, sender: SenderFields
) -> dict[str, Any]:
    """The row of one email: the API's view of it plus the texts the table shows; ``sender``
    is the one it goes out from (:class:`~sendqueue.services.senders.sender_of.SendersOf`)."""
    view = TaskView.of(
        task, campaign_paused=campaign_paused, from_addr=campaign.from_addr, sender=sender
    )
    zone = campaign.policy.zone
    own_zone = recipient_zone(task, campaign)
    row = view.model_dump(exclude={"message_id"})
    row.update(
        send_at_iso=view.send_at or "",
        # a paused campaign's Pending emails have no send time until it resumes
        send_at_text="paused" if view.paused else human_time(task.send_at, zone),
        local_text="" if view.paused or own_zone is None else zone_time(task.send_at, own_zone),
        sent_at_iso=view.sent_at or "",
        sent_at_text=human_time(task.sent_at, zone) + (" (late)" if view.late else ""),
        outcome_text=(task.outcome.value if task.outcome else "")
        + (f": {task.outcome_detail}" if task.outcome and task.outcome_detail else ""),
        outcome_title=f"since {human_time(task.outcome_at, zone)}" if task.outcome_at else "",
        moved=moved_text(task.moves, task.moved_reason),
        moved_title=f"first planned {human_time(task.planned_at, zone)}" if task.planned_at else "",
        error=task.error or task.reason or "",
        url=email_url(campaign.id, task.id),
        # campaign_rows.js (taskCells) writes the same
        sender_shown=f"{view.sender_name} <{view.sender}>" if view.sender_name else view.sender,
    )
    return row


def task_details(
    task: Task, campaign: Campaign, *, campaign_paused: bool, sender: SenderFields
) -> dict[str, Any]:
    """Every field of one email for its page: the row's texts, the times to the second, and
    the message itself as its sender sends it (``sender.*`` filled in)."""
    row = task_row(task, campaign, campaign_paused=campaign_paused, sender=sender)
    filled = fill_sender(task.subject, task.text, task.html, sender)
    zone = campaign.policy.zone
    own_zone = recipient_zone(task, campaign)
    row.update(
        message_id=task.message_id or "",
        recipient_zone=own_zone or "",
        send_at_full="" if row["paused"] else human_time(task.send_at, zone, seconds=True),
        sent_at_full=human_time(task.sent_at, zone, seconds=True),
        planned_at_full=human_time(task.planned_at, zone, seconds=True),
        planned_at_iso=row["planned_at"] or "",
        outcome_at_full=human_time(task.outcome_at, zone, seconds=True),
        outcome_at_iso=row["outcome_at"] or "",
        sent_local=zone_time(task.sent_at, own_zone) if own_zone else "",
        text=filled.text,
        html=filled.html or "",
    )
    return row
