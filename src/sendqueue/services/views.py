"""JSON shapes shared by the CLI's ``--json`` output and the HTTP API."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, DeadLetter, Task

__all__ = [
    "TASK_LIST_KEYS",
    "campaign_dict",
    "change_dict",
    "dead_letter_dict",
    "iso",
    "task_dict",
    "task_list_dict",
]


def iso(value: datetime | None) -> str | None:
    """ISO-8601 in UTC with a ``Z``, or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def campaign_dict(campaign: Campaign, counts: Mapping[TaskState, int]) -> dict[str, Any]:
    """A campaign with its task counts per state."""
    return {
        "id": campaign.id,
        "name": campaign.name,
        "state": campaign.state.value,
        "state_reason": campaign.state_reason,
        "from": campaign.from_addr,
        "reply_to": campaign.reply_to,
        "recipients": campaign.recipient_count,
        "policy": campaign.policy.to_dict(),
        "policy_text": campaign.policy.describe(),
        "counts": {state.value: counts.get(state, 0) for state in TaskState},
        "checkpoint": dict(campaign.checkpoint) if campaign.checkpoint else None,
        "created_at": iso(campaign.created_at),
        "updated_at": iso(campaign.updated_at),
    }


def task_dict(task: Task) -> dict[str, Any]:
    """A task as ``campaign tasks --json`` prints it."""
    return {
        "id": task.id,
        "position": task.position,
        "email": task.email,
        "name": task.name,
        "subject": task.subject,
        "state": task.state.value,
        "send_at": iso(task.send_at),
        "sent_at": iso(task.sent_at),
        "attempts": task.attempts,
        "message_id": task.message_id,
        "error": task.error,
    }


def change_dict(entry: ChangeLogEntry) -> dict[str, Any]:
    """A change-log entry, as the live stream sends it."""
    return {
        "id": entry.id,
        "campaign_id": entry.campaign_id,
        "task_id": entry.task_id,
        "from": entry.from_state,
        "to": entry.to_state,
        "at": iso(entry.at),
        "note": entry.note,
    }


def dead_letter_dict(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "schedule": letter.schedule_name,
        "group": letter.group,
        "payload": dict(letter.payload),
        "error": letter.error,
        "attempts": letter.attempts,
        "failed_at": iso(letter.failed_at),
    }


#: The keys ``campaign tasks --json`` lists, in order: a task without position, name and subject.
TASK_LIST_KEYS = ("id", "email", "state", "send_at", "sent_at", "attempts", "message_id", "error")


def task_list_dict(task: Task) -> dict[str, Any]:
    """A task as ``campaign tasks --json`` lists it: :func:`task_dict` cut to TASK_LIST_KEYS."""
    full = task_dict(task)
    return {key: full[key] for key in TASK_LIST_KEYS}
