"""Rows <-> domain objects, shared by the SQLite and the PostgreSQL task store.

The readers take rows of the tables in :mod:`~sendqueue.adapters.sql.schema` (SQLAlchemy rows,
or the drivers' tuples with the columns in :data:`TASK_COLUMNS` order); the writers build the
parameter mappings of SQLAlchemy Core inserts. Times are aware UTC datetimes on both sides
(SQLite's text times are the SQLite store's own business).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Any, TypeVar

import sqlalchemy as sa

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import CampaignState, StopOnReply, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, Recipient, Task
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.steps import steps_from_data, steps_to_data

__all__ = [
    "CHUNK_SIZE",
    "INSERT_COLUMNS",
    "OUTCOMES",
    "STATES",
    "TASK_COLUMNS",
    "TASK_WIDTH",
    "JsonVariables",
    "batches",
    "campaign_from_row",
    "campaign_row",
    "chunks",
    "created_entries",
    "entry_from_row",
    "json_ready",
    "log_row",
    "recipient_rows",
    "task_from_row",
    "task_from_text_row",
    "text_when",
]


class JsonVariables(MutableMapping[str, str]):
    """A recipient's variables as stored (JSON text), decoded on first use: provisioning reads
    every recipient and never its variables (its texts were rendered at import), and decoding
    them all cost about a twentieth of a provisioning run (docs/performance.md). A copy, as
    every store returns one: changing it changes nothing stored. A mapping, not a ``dict``
    (as the port types it): ``dict(variables)`` before serialising it."""

    __slots__ = ("_data", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._data: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        if self._data is None:
            self._data = json.loads(self._text)
        return self._data

    def __getitem__(self, key: str) -> str:
        return self._decoded()[key]

    def __setitem__(self, key: str, value: str) -> None:
        self._decoded()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._decoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __repr__(self) -> str:
        return repr(self._decoded())


#: Rows per INSERT statement. 500 rows of the widest table stay far below both SQLite's (32766)
#: and PostgreSQL's (65535) limit on bound parameters.
CHUNK_SIZE = 500

#: The ``tasks`` columns in table order, for the statements the drivers run directly.
TASK_COLUMNS = (
    "id, campaign_id, position, email, name, subject, text, html, send_at, state, token, "
    "attempts, claimed_at, sent_at, message_id, error, created_at, updated_at, planned_at, "
    "moves, moved_reason, reason, outcome, outcome_detail, outcome_at, sender_id, sender, "
    "timezone, step"
)

#: How many columns :data:`TASK_COLUMNS` names (a task row's width).
TASK_WIDTH = len(TASK_COLUMNS.split(","))

#: The columns a new task is inserted with: :data:`TASK_COLUMNS` and ``email_key`` (the
#: address's compared form, which only the feedback store's index reads).
INSERT_COLUMNS = TASK_COLUMNS + ", email_key"

#: TaskOutcome by value (None for a task not sent yet).
OUTCOMES: dict[str | None, TaskOutcome | None] = {o.value: o for o in TaskOutcome}
OUTCOMES[None] = None

#: TaskState by value, cheaper than ``TaskState(value)`` per row.
STATES = {state.value: state for state in TaskState}

_T = TypeVar("_T")


def chunks(items: Sequence[_T], size: int = CHUNK_SIZE) -> Iterator[Sequence[_T]]:
    """``items`` in slices of ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def batches(items: Iterable[_T], size: int = CHUNK_SIZE) -> Iterator[list[_T]]:
    """``items``, which may be a one-pass iterator, in lists of at most ``size``."""
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def json_ready(field: str, value: object) -> str:
    """``value`` as JSON text (as SQLAlchemy's JSON type stores it), or InvalidField."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidField(field, value, f"must be JSON-serialisable: {exc}") from exc


def campaign_from_row(row: sa.Row[Any]) -> Campaign:
    m = row._mapping
    return Campaign(
        id=m["id"],
        name=m["name"],
        policy=SendingPolicy.from_dict(m["policy"]),
        from_addr=m["from_addr"],
        state=CampaignState(m["state"]),
        reply_to=m["reply_to"],
        recipient_count=m["recipient_count"],
        state_reason=m["state_reason"],
        checkpoint=m["checkpoint"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        stop_on_reply=StopOnReply(m["stop_on_reply"]),
        unsubscribe_footer=bool(m["unsubscribe_footer"]),
        sender_ids=tuple(m["sender_ids"] or ()),
        local_time=bool(m["local_time"]),
        steps=steps_from_data(m["steps"]),
    )


def task_from_row(row: Sequence[Any]) -> Task:
    """A task from a row of the ``tasks`` columns in table order (``select(tasks)``; the
    trailing ``email_key`` of such a row is ignored)."""
    (
        id_, campaign_id, position, email, name, subject, text, html, send_at, state, token,
        attempts, claimed_at, sent_at, message_id, error, created_at, updated_at, planned_at,
        moves, moved_reason, reason, outcome, outcome_detail, outcome_at, sender_id, sender,
        timezone, step,
    ) = row[:TASK_WIDTH]  # fmt: skip
    # Positional: tasks are read by the hundred thousand; see docs/performance.md.
    return Task(
        id_, campaign_id, position, email, name, subject, text, html, send_at, token,
        STATES[state], attempts, claimed_at, sent_at, message_id, error, created_at, updated_at,
        planned_at, moves, moved_reason, reason, OUTCOMES[outcome], outcome_detail, outcome_at,
        sender_id, sender, timezone, step,
    )  # fmt: skip


def text_when(value: str) -> datetime:
    """Read what :func:`~sendqueue.adapters.sql.schema.sqlite_text` wrote (SQLite's driver
    rows carry times as that text)."""
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _text_time(value: str | None) -> datetime | None:
    return None if value is None else text_when(value)


def task_from_text_row(row: Sequence[Any]) -> Task:
    """:func:`task_from_row` of a SQLite driver row (its times still the text UtcDateTime
    stores)."""
    (
        id_, campaign_id, position, email, name, subject, text, html, send_at, state, token,
        attempts, claimed_at, sent_at, message_id, error, created_at, updated_at, planned_at,
        moves, moved_reason, reason, outcome, outcome_detail, outcome_at, sender_id, sender,
        timezone, step,
    ) = row  # fmt: skip
    return Task(
        id_, campaign_id, position, email, name, subject, text, html,
        text_when(send_at), token, STATES[state], attempts,
        _text_time(claimed_at), _text_time(sent_at), message_id, error,
        text_when(created_at), text_when(updated_at),
        _text_time(planned_at), moves, moved_reason, reason, OUTCOMES[outcome], outcome_detail,
        _text_time(outcome_at), sender_id, sender, timezone, step,
    )  # fmt: skip


def entry_from_row(row: sa.Row[Any]) -> ChangeLogEntry:
    m = row._mapping
    return ChangeLogEntry(
        id=m["id"],
        campaign_id=m["campaign_id"],
        task_id=m["task_id"],
        from_state=m["from_state"],
        to_state=m["to_state"],
        at=m["at"],
        note=m["note"],
    )


def campaign_row(campaign: Campaign, recipient_count: int) -> dict[str, Any]:
    """The ``campaigns`` row of a new campaign."""
    return {
        "id": campaign.id,
        "name": campaign.name,
        "policy": campaign.policy.to_dict(),
        "from_addr": campaign.from_addr,
        "reply_to": campaign.reply_to,
        "state": campaign.state.value,
        "state_reason": campaign.state_reason,
        "recipient_count": recipient_count,
        "checkpoint": None if campaign.checkpoint is None else dict(campaign.checkpoint),
        "created_at": campaign.created_at,
        "updated_at": campaign.updated_at,
        "stop_on_reply": StopOnReply(campaign.stop_on_reply).value,
        "unsubscribe_footer": bool(campaign.unsubscribe_footer),
        # NULL for none, as a campaign from before migration 0007 has.
        "sender_ids": list(campaign.sender_ids) if campaign.sender_ids else None,
        "local_time": bool(campaign.local_time),
        "steps": steps_to_data(campaign.steps) if campaign.steps else None,
    }


def recipient_rows(campaign_id: str, recipients: Sequence[Recipient]) -> list[dict[str, Any]]:
    """The ``recipients`` rows of a new campaign."""
    return [
        {
            "campaign_id": campaign_id,
            "position": r.position,
            "email": r.email,
            "name": r.name,
            "subject": r.subject,
            "text": r.text,
            "html": r.html,
            "variables": dict(r.variables),
            "timezone": r.timezone,
        }
        for r in recipients
    ]


def log_row(
    campaign_id: str,
    task_id: str | None,
    from_state: str | None,
    to_state: str,
    at: datetime,
    note: str | None,
) -> dict[str, Any]:
    """One ``change_log`` row (its id is the database's)."""
    return {
        "campaign_id": campaign_id,
        "task_id": task_id,
        "from_state": from_state,
        "to_state": to_state,
        "at": at,
        "note": note,
    }


def created_entries(
    tasks: Sequence[Task], inserted: Collection[str], at: datetime
) -> list[Mapping[str, Any]]:
    """The ``None -> Pending`` (or ``None -> Cancelled``, noted with its reason) rows of the
    tasks whose id is in ``inserted``, in input order, one per id (a later duplicate of an id in
    the input was not inserted)."""
    left = set(inserted)
    entries: list[Mapping[str, Any]] = []
    for t in tasks:
        if t.id in left:
            left.discard(t.id)
            note = t.reason if t.state is TaskState.CANCELLED else None
            entries.append(log_row(t.campaign_id, t.id, None, t.state.value, at, note))
    return entries
