"""Items of the DynamoDB task store: tasks, campaigns, recipients and change-log items,
and back. Instants are strings that sort like the instants (``time_key``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sendqueue.domain.errors import (
    InvalidField,
)
from sendqueue.domain.lifecycle import (
    CampaignState,
    StopOnReply,
    TaskOutcome,
    TaskState,
)
from sendqueue.domain.models import (
    Campaign,
    ChangeLogEntry,
    Recipient,
    Task,
    utc,
)
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.steps import steps_from_data, steps_to_data
from sendqueue.domain.suppression import key_of_normalized

__all__ = [
    "PendingEntry",
    "campaign_from_item",
    "campaign_item",
    "dumps",
    "entry_size",
    "item_size",
    "json_copy",
    "log_end",
    "log_entries",
    "log_item",
    "log_key",
    "num_attr",
    "parse_opt_time",
    "parse_time",
    "position_key",
    "position_marker",
    "recipient_item",
    "str_attr",
    "task_doc",
    "task_from_item",
    "task_item",
    "time_key",
]


def time_key(value: datetime) -> str:
    """A UTC instant as a string that sorts like the instant."""
    return utc(value).strftime("%Y-%m-%dT%H:%M:%S.%f")


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def parse_opt_time(value: str | None) -> datetime | None:
    return None if value is None else parse_time(value)


def str_attr(value: str) -> dict[str, str]:
    return {"S": value}


def num_attr(value: int) -> dict[str, str]:
    return {"N": str(value)}


def dumps(value: object) -> str:
    # Not ASCII-escaped: the item size DynamoDB counts is the UTF-8 size.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def item_size(item: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB counts it (names plus UTF-8 values), near enough."""
    total = 0
    for name, value in item.items():
        total += len(name)
        for kind, raw in value.items():
            if kind == "SS":
                total += sum(len(v.encode()) for v in raw)
            else:
                total += len(str(raw).encode())
    return total


def json_copy(field: str, value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise InvalidField(field, value, f"must be JSON-serialisable: {exc}") from exc


def position_key(position: int) -> str:
    return f"{position:010d}"


def position_marker(position: int, step: int) -> str:
    """The sort key of the item that holds a campaign's (position, step) for one task; step 1
    keeps the key markers had before steps."""
    key = position_key(position)
    return key if step == 1 else f"{key}#s{step}"


def log_key(first: int) -> str:
    return f"{first:020d}"


def task_doc(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "campaign_id": task.campaign_id,
        "position": task.position,
        "email": task.email,
        "name": task.name,
        "subject": task.subject,
        "text": task.text,
        "html": task.html,
        "send_at": time_key(task.send_at),
        "token": task.token,
        "state": task.state.value,
        "attempts": task.attempts,
        "claimed_at": None if task.claimed_at is None else time_key(task.claimed_at),
        "sent_at": None if task.sent_at is None else time_key(task.sent_at),
        "message_id": task.message_id,
        "error": task.error,
        "created_at": time_key(task.created_at),
        "updated_at": time_key(task.updated_at),
        "planned_at": time_key(task.planned_at or task.send_at),
        "moves": task.moves,
        "moved_reason": task.moved_reason,
        "reason": task.reason,
        "outcome": None if task.outcome is None else TaskOutcome(task.outcome).value,
        "outcome_detail": task.outcome_detail,
        "outcome_at": None if task.outcome_at is None else time_key(task.outcome_at),
        "sender_id": task.sender_id,
        "sender": task.sender,
        "timezone": task.timezone,
        "step": task.step,
    }


def task_item(task: Task, version: int) -> dict[str, Any]:
    item: dict[str, Any] = {
        "pk": str_attr(f"T#{task.id}"),
        "sk": str_attr("#"),
        "v": num_attr(version),
        "st": str_attr(task.state.value),
        "gc": str_attr(task.campaign_id),
        "gp": num_attr(task.position),
        "gs": str_attr(f"{task.campaign_id}#{task.state.value}"),
        "gd": str_attr(task.state.value),
        "gt": str_attr(f"{time_key(task.send_at)}#{task.id}"),
        # The address's compared form: the by_address index's key (FeedbackStore.tasks_for).
        "ga": str_attr(key_of_normalized(task.email)),
        "d": str_attr(dumps(task_doc(task))),
    }
    if task.claimed_at is not None:
        item["ca"] = str_attr(time_key(task.claimed_at))
    if task.reason is not None:
        # Filtered on when counting a campaign's suppressed tasks.
        item["rs"] = str_attr(task.reason)
    if task.outcome is not None:
        # Read when counting a campaign's outcomes (without parsing ``d``).
        item["oc"] = str_attr(TaskOutcome(task.outcome).value)
    if task.step != 1:
        # Filtered on when listing one step's tasks; absent means step 1, as on older items.
        item["sp"] = num_attr(task.step)
    return item


def task_from_item(item: Mapping[str, Any]) -> tuple[Task, int]:
    doc = json.loads(item["d"]["S"])
    task = Task(
        id=doc["id"],
        campaign_id=doc["campaign_id"],
        position=doc["position"],
        email=doc["email"],
        name=doc["name"],
        subject=doc["subject"],
        text=doc["text"],
        html=doc["html"],
        send_at=parse_time(doc["send_at"]),
        token=doc["token"],
        state=TaskState(doc["state"]),
        attempts=doc["attempts"],
        claimed_at=parse_opt_time(doc["claimed_at"]),
        sent_at=parse_opt_time(doc["sent_at"]),
        message_id=doc["message_id"],
        error=doc["error"],
        created_at=parse_time(doc["created_at"]),
        updated_at=parse_time(doc["updated_at"]),
        # Items written before these fields existed: planned as sent, never moved.
        planned_at=parse_time(doc.get("planned_at") or doc["send_at"]),
        moves=doc.get("moves", 0),
        moved_reason=doc.get("moved_reason"),
        reason=doc.get("reason"),
        # Items written before outcomes existed have none.
        outcome=None if doc.get("outcome") is None else TaskOutcome(doc["outcome"]),
        outcome_detail=doc.get("outcome_detail"),
        outcome_at=parse_opt_time(doc.get("outcome_at")),
        # Items written before senders existed: the campaign's implicit sender.
        sender_id=doc.get("sender_id"),
        sender=doc.get("sender"),
        timezone=doc.get("timezone"),
        # Items written before sequences: step 1.
        step=doc.get("step", 1),
    )
    return task, int(item["v"]["N"])


def campaign_item(campaign: Campaign, recipient_key: str) -> dict[str, Any]:
    doc = {
        "id": campaign.id,
        "name": campaign.name,
        "policy": campaign.policy.to_dict(),
        "from_addr": campaign.from_addr,
        "reply_to": campaign.reply_to,
        "state": campaign.state.value,
        "state_reason": campaign.state_reason,
        "recipient_count": campaign.recipient_count,
        "checkpoint": None if campaign.checkpoint is None else dict(campaign.checkpoint),
        "created_at": time_key(campaign.created_at),
        "updated_at": time_key(campaign.updated_at),
        "stop_on_reply": StopOnReply(campaign.stop_on_reply).value,
        "unsubscribe_footer": bool(campaign.unsubscribe_footer),
        "sender_ids": list(campaign.sender_ids),
        "local_time": bool(campaign.local_time),
        "steps": steps_to_data(campaign.steps),
    }
    return {
        "pk": str_attr("campaign"),
        "sk": str_attr(campaign.id),
        "st": str_attr(campaign.state.value),
        "rk": str_attr(recipient_key),
        "d": str_attr(dumps(doc)),
    }


def campaign_from_item(item: Mapping[str, Any]) -> Campaign:
    doc = json.loads(item["d"]["S"])
    return Campaign(
        id=doc["id"],
        name=doc["name"],
        policy=SendingPolicy.from_dict(doc["policy"]),
        from_addr=doc["from_addr"],
        state=CampaignState(doc["state"]),
        reply_to=doc["reply_to"],
        recipient_count=doc["recipient_count"],
        state_reason=doc["state_reason"],
        checkpoint=doc["checkpoint"],
        created_at=parse_time(doc["created_at"]),
        updated_at=parse_time(doc["updated_at"]),
        # Items written before these options existed: the defaults.
        stop_on_reply=StopOnReply(doc.get("stop_on_reply", StopOnReply.SENDER.value)),
        unsubscribe_footer=bool(doc.get("unsubscribe_footer", False)),
        # Items written before senders existed: no senders, the campaign's zone.
        sender_ids=tuple(doc.get("sender_ids") or ()),
        local_time=bool(doc.get("local_time", False)),
        # Items written before steps were stored: the campaign's one email, rendered at import.
        steps=steps_from_data(doc.get("steps")),
    )


def recipient_item(campaign_id: str, key: str, r: Recipient) -> dict[str, Any]:
    doc = {
        "position": r.position,
        "email": r.email,
        "name": r.name,
        "subject": r.subject,
        "text": r.text,
        "html": r.html,
        "variables": dict(r.variables),
        "timezone": r.timezone,
    }
    return {
        "pk": str_attr(f"R#{campaign_id}#{key}"),
        "sk": str_attr(position_key(r.position)),
        "d": str_attr(dumps(doc)),
    }


#: A change-log entry still to be numbered: (campaign, task, from, to, at, note).
PendingEntry = tuple[str, str | None, str | None, str, datetime, str | None]


def entry_size(entry: PendingEntry) -> int:
    cid, tid, _src, _dst, _at, note = entry
    return 80 + len(cid.encode()) + len((tid or "").encode()) + len((note or "").encode())


def log_item(first: int, entries: Sequence[PendingEntry]) -> dict[str, Any]:
    rows = [[cid, tid, src, dst, time_key(at), note] for cid, tid, src, dst, at, note in entries]
    return {
        "pk": str_attr("log"),
        "sk": str_attr(log_key(first)),
        "n": num_attr(len(entries)),
        "cs": {"SS": sorted({e[0] for e in entries})},
        "d": str_attr(dumps(rows)),
    }


def log_entries(item: Mapping[str, Any]) -> Iterator[ChangeLogEntry]:
    first = int(item["sk"]["S"])
    for offset, (cid, tid, src, dst, at, note) in enumerate(json.loads(item["d"]["S"])):
        yield ChangeLogEntry(first + offset, cid, tid, src, dst, parse_time(at), note)


def log_end(item: Mapping[str, Any]) -> int:
    """The id of the last entry in a log item."""
    return int(item["sk"]["S"]) + int(item["n"]["N"]) - 1
