"""The records sendqueue keeps: campaigns, recipients, tasks, change-log entries, dead letters.

Plain frozen dataclasses, no I/O. All instants are aware datetimes in UTC.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypedDict

from .errors import IllegalTransition, InvalidField
from .lifecycle import CampaignState, StopOnReply, TaskOutcome, TaskState
from .policy import SendingPolicy
from .steps import MAX_STEPS, Step

__all__ = [
    "CONTROL_GROUP",
    "MAX_CURSOR",
    "MAX_STEP",
    "Campaign",
    "ChangeLogEntry",
    "DeadLetter",
    "Move",
    "Recipient",
    "Task",
    "TaskChanges",
    "check_cursor",
    "check_limit",
    "check_new_tasks",
    "check_step",
    "checked_changes",
    "expected_schedule_name",
    "new_campaign_id",
    "new_token",
    "pending_task",
    "recipient_of",
    "schedule_group",
    "schedule_name",
    "step_of",
    "task_id",
    "utc",
]


#: The largest cursor (a position or a change-log id) any store accepts: a signed 64-bit
#: integer, which SQLite, PostgreSQL's BIGINT and DynamoDB numbers all hold.
MAX_CURSOR = 2**63 - 1


def check_limit(limit: int, *, field: str = "limit") -> None:
    """A page size: zero or more (InvalidField naming ``field`` otherwise)."""
    if limit < 0:
        raise InvalidField(field, limit, "must be zero or more")


def check_cursor(value: int, *, field: str = "after", lowest: int = -1) -> None:
    """A paging cursor between ``lowest`` and :data:`MAX_CURSOR` (InvalidField otherwise)."""
    if not lowest <= value <= MAX_CURSOR:
        raise InvalidField(field, value, f"must be between {lowest} and {MAX_CURSOR}")


def utc(value: datetime) -> datetime:
    """``value`` converted to UTC; a naive value is refused (it would be ambiguous)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r} where an aware one is required")
    return value.astimezone(UTC)


def new_campaign_id() -> str:
    """A short random id, safe inside schedule names (``[0-9a-z]``)."""
    return "c" + secrets.token_hex(6)


#: The most steps a campaign's sequence has; a task's ``step`` is 1 to this.
MAX_STEP = MAX_STEPS


def task_id(campaign_id: str, position: int, step: int = 1) -> str:
    """The deterministic id of recipient ``position``'s task for ``step``: provisioning is
    idempotent. Step 1 keeps the ids tasks had before sequences (``<campaign>-<position>``)."""
    if step == 1:
        return f"{campaign_id}-{position}"
    check_step(step)
    return f"{campaign_id}-{position}-s{step}"


def step_of(task_id_: str) -> int:
    """The step a task id names (:func:`task_id`): 1 unless it ends in ``-s<step>``."""
    head, sep, tail = task_id_.rpartition("-s")
    return int(tail) if sep and head and tail.isdigit() else 1


def schedule_name(task_id_: str, attempt: int = 0) -> str:
    """The execution layer's schedule name for a task's ``attempt`` (<= 64 chars of
    ``[0-9a-zA-Z-_.]``).

    The attempt number is part of the name so that the schedule of a retry never collides with
    the schedule still in flight for the attempt that failed (that one deletes itself when its
    invocation returns). A later step's task id adds at most 4 characters (``-s10``): a name
    stays near half the limit.
    """
    return f"sq-{task_id_}.{attempt}"


def expected_schedule_name(task: Task) -> str:
    """The name the schedule of a Pending ``task`` must have right now."""
    return schedule_name(task.id, task.attempts)


def schedule_group(campaign_id: str) -> str:
    """Each campaign's schedules live in their own group, so the reconciler lists one campaign."""
    return f"sq-{campaign_id}"


#: The group of control schedules (provisioning continuations), not tied to one task.
CONTROL_GROUP = "sq-control"


def new_token() -> str:
    """A fresh scheduler client token (<= 64 chars of ``[a-zA-Z0-9-_]``)."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Recipient:
    """One imported row: the snapshot a task will send. ``position`` is 0-based, in file order."""

    position: int
    email: str
    name: str = ""
    subject: str = ""
    text: str = ""
    html: str | None = None
    variables: Mapping[str, str] = field(default_factory=dict)
    timezone: str | None = None
    """The recipient's own IANA zone (CSV column ``timezone``); None: the campaign's."""


def recipient_of(
    position: int,
    email: str,
    name: str,
    subject: str,
    text: str,
    html: str | None,
    variables: Mapping[str, str],
    timezone: str | None,
) -> Recipient:
    """``Recipient(...)`` of a stored row, equal to the constructor's without its per-field
    ``object.__setattr__`` (provisioning reads every recipient once)."""
    recipient = object.__new__(Recipient)
    object.__setattr__(recipient, "__dict__", {
        "position": position, "email": email, "name": name, "subject": subject, "text": text,
        "html": html, "variables": variables, "timezone": timezone,
    })  # fmt: skip
    return recipient


@dataclass(frozen=True)
class Campaign:
    """A campaign: its policy, sender, state and provisioning checkpoint."""

    id: str
    name: str
    policy: SendingPolicy
    from_addr: str
    state: CampaignState = CampaignState.DRAFT
    reply_to: str | None = None
    recipient_count: int = 0
    state_reason: str | None = None
    checkpoint: Mapping[str, Any] | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    stop_on_reply: StopOnReply = StopOnReply.SENDER
    """Which Pending emails of a recipient a reply cancels."""
    unsubscribe_footer: bool = False
    """Whether every email gets a one-line unsubscribe footer."""
    sender_ids: tuple[str, ...] = ()
    """The senders its recipients are spread across; empty: ``from_addr`` is an
    implicit sender with no cap."""
    local_time: bool = False
    """Whether windows, weekdays and skip dates are read in each recipient's zone."""
    steps: tuple[Step, ...] = ()
    """Its sequence, as templates: step 1 first (``domain/steps.py``). Empty for a campaign
    stored before steps were: its one email's templates were rendered at import."""


@dataclass(frozen=True)
class Task:
    """One email: a recipient snapshot, its send time, its state and what happened to it."""

    id: str
    campaign_id: str
    position: int
    email: str
    name: str
    subject: str
    text: str
    html: str | None
    send_at: datetime
    token: str
    state: TaskState = TaskState.PENDING
    attempts: int = 0
    claimed_at: datetime | None = None
    sent_at: datetime | None = None
    message_id: str | None = None
    error: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    planned_at: datetime | None = None
    """The first send instant planned for the task; stores set it to ``send_at`` at insert."""
    moves: int = 0
    """How many times the task was moved to another slot (outage, retry, resume)."""
    moved_reason: str | None = None
    """Why it was last moved, e.g. "worker down 16:48-17:48 UTC" or "transient: 421 ..."."""
    reason: str | None = None
    """Why it was cancelled, e.g. "suppressed: bounced" (None when nobody said)."""
    outcome: TaskOutcome | None = None
    """What happened after sending (None until sent, then "accepted", later maybe "bounced")."""
    outcome_detail: str | None = None
    """What the feedback said, e.g. "5.1.1 smtp; 550 5.1.1 user unknown"."""
    outcome_at: datetime | None = None
    """When the outcome was last set (aware, UTC)."""
    sender_id: str | None = None
    """The sender it goes out from (None: the campaign's implicit ``from_addr`` sender)."""
    sender: str | None = None
    """That sender's address, as planned (None: the campaign's ``from_addr``)."""
    timezone: str | None = None
    """The recipient's zone in a local-time campaign (None: the campaign's)."""
    step: int = 1
    """Which step of the campaign's sequence the email is, 1-based (1 to :data:`MAX_STEP`)."""


def pending_task(
    id: str,
    campaign_id: str,
    position: int,
    email: str,
    name: str,
    subject: str,
    text: str,
    html: str | None,
    send_at: datetime,
    token: str,
    at: datetime,
    sender_id: str | None = None,
    sender: str | None = None,
    timezone: str | None = None,
    step: int = 1,
) -> Task:
    """``Task(...)`` of a new Pending task created and updated ``at``, equal to the
    constructor's, in a third of its time: a frozen dataclass's ``__init__`` sets its 29
    fields one ``object.__setattr__`` at a time, and provisioning builds one per email."""
    task = object.__new__(Task)
    object.__setattr__(task, "__dict__", {
        "id": id, "campaign_id": campaign_id, "position": position, "email": email,
        "name": name, "subject": subject, "text": text, "html": html, "send_at": send_at,
        "token": token, "state": TaskState.PENDING, "attempts": 0, "claimed_at": None,
        "sent_at": None, "message_id": None, "error": None, "created_at": at,
        "updated_at": at, "planned_at": None, "moves": 0, "moved_reason": None,
        "reason": None, "outcome": None, "outcome_detail": None, "outcome_at": None,
        "sender_id": sender_id, "sender": sender, "timezone": timezone, "step": step,
    })  # fmt: skip
    return task


class TaskChanges(TypedDict, total=False):
    """Fields a transition may set along with the state. A key left out keeps its value."""

    send_at: datetime
    token: str
    attempts: int
    claimed_at: datetime | None
    sent_at: datetime | None
    message_id: str | None
    error: str | None
    moves: int
    moved_reason: str | None
    reason: str | None
    outcome: TaskOutcome | None
    outcome_detail: str | None
    outcome_at: datetime | None


class Move(NamedTuple):
    """A Pending task moved to another slot (``TaskStore.reschedule``): applied only while the
    task is Pending and still holds ``token``; it then gets ``send_at`` and ``new_token``."""

    task_id: str
    token: str
    send_at: datetime
    new_token: str


_TASK_CHANGE_FIELDS = frozenset(TaskChanges.__annotations__)
_TASK_TIME_FIELDS = frozenset({"send_at", "claimed_at", "sent_at", "outcome_at"})


def checked_changes(changes: TaskChanges | None) -> dict[str, Any]:
    """The fields a transition sets, as every store takes them: a key :class:`TaskChanges`
    does not have is an ``InvalidField("changes", ...)``; times are converted to UTC (a naive
    one raises ValueError, as :func:`utc` does)."""
    values: dict[str, Any] = dict(changes or {})
    unknown = values.keys() - _TASK_CHANGE_FIELDS
    if unknown:
        raise InvalidField(
            "changes", sorted(unknown), f"a transition may set {sorted(_TASK_CHANGE_FIELDS)}"
        )
    for key in _TASK_TIME_FIELDS & values.keys():
        if values[key] is not None:
            values[key] = utc(values[key])
    return values


#: The states a task may be inserted in: Pending, or Cancelled for a recipient on the
#: suppression list (with its ``reason``; the change log then says ``None -> Cancelled``).
_NEW_TASK_STATES = frozenset({TaskState.PENDING, TaskState.CANCELLED})


def check_step(step: int, *, field: str = "step") -> None:
    """A sequence step: an int from 1 to :data:`MAX_STEP` (InvalidField naming ``field``)."""
    if type(step) is not int or not 1 <= step <= MAX_STEP:
        raise InvalidField(field, step, f"must be a whole number from 1 to {MAX_STEP}")


def check_new_tasks(tasks: Iterable[Task]) -> None:
    """IllegalTransition unless every task is Pending, or Cancelled with a reason; InvalidField
    (``step``) for a step outside 1 to :data:`MAX_STEP`."""
    for task in tasks:
        if task.step != 1:  # the common case costs one comparison per task
            check_step(task.step)
        if task.state not in _NEW_TASK_STATES or (
            task.state is TaskState.CANCELLED and not task.reason
        ):
            raise IllegalTransition(
                "task",
                "(new)",
                task.state.value,
                "tasks are created Pending, or Cancelled with a reason",
            )


@dataclass(frozen=True)
class ChangeLogEntry:
    """One change, appended in the same transaction as the write it records.

    ``id`` is monotonic across the whole store. For a task, ``from_state``/``to_state`` are
    :class:`TaskState` values (``from_state`` is None when the task was created). For a campaign
    event ``task_id`` is None and the states are :class:`CampaignState` values, or ``to_state``
    is ``"progress"`` with ``note`` saying how far provisioning got.
    """

    id: int
    campaign_id: str
    task_id: str | None
    from_state: str | None
    to_state: str
    at: datetime
    note: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    """An invocation the execution layer gave up on after its retries."""

    id: str
    schedule_name: str
    group: str
    payload: Mapping[str, str]
    error: str
    attempts: int
    failed_at: datetime
