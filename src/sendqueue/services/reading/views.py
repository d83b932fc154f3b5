"""The one view of a campaign, a task, a dead letter and a change: pydantic models shared by the
CLI's ``--json`` output, the HTTP API (its response models) and the pages.

Each model has ``of(...)`` to build it from the domain object; the ``*_dict`` functions are its
JSON form (``model_dump(mode="json", by_alias=True)``), as the CLI prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol, overload

from pydantic import BaseModel, ConfigDict, Field

from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, DeadLetter, Task
from sendqueue.domain.sender_fields import SenderFields, fill_sender
from sendqueue.domain.suppression import Suppression
from sendqueue.ports import FeedbackOutcomes, SuppressionList, Tasks

__all__ = [
    "LATE_SECONDS",
    "TASK_LIST_KEYS",
    "CampaignCounts",
    "CampaignView",
    "ChangeView",
    "DeadLetterView",
    "IsoTime",
    "SuppressionView",
    "TaskView",
    "campaign_dict",
    "campaign_moves",
    "campaign_outcomes",
    "campaign_suppressed",
    "change_dict",
    "dead_letter_dict",
    "is_late",
    "iso",
    "task_dict",
    "task_list_dict",
]

#: An email sent more than this many seconds after its send time counts as late.
LATE_SECONDS = 60

#: A time as :func:`iso` writes it: ISO-8601 in UTC with a ``Z``.
IsoTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


@overload
def iso(value: datetime) -> str: ...
@overload
def iso(value: None) -> None: ...
@overload
def iso(value: datetime | None) -> str | None: ...
def iso(value: datetime | None) -> str | None:
    """ISO-8601 in UTC with a ``Z``, or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    def as_json(self) -> dict[str, Any]:
        """The JSON form: field names as the API and ``--json`` spell them."""
        return self.model_dump(mode="json", by_alias=True)


class CampaignCounts(Tasks, FeedbackOutcomes, SuppressionList, Protocol):
    """What a campaign's view reads its counts from: tasks per state and their moves, outcomes,
    suppressed tasks (one backend's store keeps all of them)."""


class CampaignView(_View):
    """A campaign with its task counts per state (``campaign show --json``)."""

    id: str
    name: str
    state: str
    state_reason: str | None
    from_addr: str | None = Field(alias="from")
    reply_to: str | None
    recipients: int
    policy: dict[str, Any] = Field(description="timezone, per_day, weekdays, windows, ...")
    policy_text: str
    counts: dict[str, int] = Field(description="tasks per state, every state named")
    moved: int = Field(description="emails moved at least once (outage, retry, resume)")
    late: int = Field(description=f"emails sent more than {LATE_SECONDS} s after send_at")
    suppressed: int = Field(
        description="emails cancelled because their address is on the suppression list"
    )
    outcomes: dict[str, int] = Field(
        description="sent emails per outcome (accepted, bounced, complained, replied, "
        "unsubscribed), every outcome named"
    )
    stop_on_reply: str = Field(
        description="which Pending emails of a recipient a reply cancels: sender (every "
        "active campaign of the same From), campaign (this one) or off"
    )
    unsubscribe_footer: bool = Field(
        description="whether every email gets a one-line unsubscribe footer"
    )
    senders: list[str] = Field(
        default_factory=list,
        description="the ids of the senders its emails are spread across; empty: `from` sends",
    )
    local_time: bool = Field(
        False, description="whether the windows are read in each recipient's own timezone"
    )
    checkpoint: dict[str, Any] | None
    created_at: IsoTime
    updated_at: IsoTime

    @classmethod
    def fields_of(
        cls,
        campaign: Campaign,
        counts: Mapping[TaskState, int],
        moves: tuple[int, int],
        suppressed: int,
        outcomes: Mapping[TaskOutcome, int],
    ) -> dict[str, Any]:
        """The field values of ``campaign`` (for subclasses that add their own); ``moves`` is
        ``TaskStore.count_moves`` (moved, late), ``suppressed`` the count of
        :func:`campaign_suppressed`, ``outcomes`` that of :func:`campaign_outcomes`."""
        return {
            "moved": moves[0],
            "late": moves[1],
            "suppressed": suppressed,
            "outcomes": {outcome.value: outcomes.get(outcome, 0) for outcome in TaskOutcome},
            "stop_on_reply": campaign.stop_on_reply.value,
            "unsubscribe_footer": campaign.unsubscribe_footer,
            "senders": list(campaign.sender_ids),
            "local_time": campaign.local_time,
            "id": campaign.id,
            "name": campaign.name,
            "state": campaign.state.value,
            "state_reason": campaign.state_reason,
            "from_addr": campaign.from_addr,
            "reply_to": campaign.reply_to,
            "recipients": campaign.recipient_count,
            "policy": campaign.policy.to_dict(),
            "policy_text": campaign.policy.describe(local_time=campaign.local_time),
            "counts": {state.value: counts.get(state, 0) for state in TaskState},
            "checkpoint": dict(campaign.checkpoint) if campaign.checkpoint else None,
            "created_at": iso(campaign.created_at),
            "updated_at": iso(campaign.updated_at),
        }

    @classmethod
    def of(
        cls,
        campaign: Campaign,
        counts: Mapping[TaskState, int],
        moves: tuple[int, int],
        suppressed: int,
        outcomes: Mapping[TaskOutcome, int],
    ) -> CampaignView:
        return cls(**cls.fields_of(campaign, counts, moves, suppressed, outcomes))

    @classmethod
    def read(cls, store: CampaignCounts, campaign: Campaign) -> CampaignView:
        """The view of ``campaign`` with its counts read from ``store``."""
        return cls.of(
            campaign,
            store.count_tasks(campaign.id),
            campaign_moves(store, campaign),
            campaign_suppressed(store, campaign),
            campaign_outcomes(store, campaign),
        )


def campaign_outcomes(store: FeedbackOutcomes, campaign: Campaign) -> dict[TaskOutcome, int]:
    """The campaign's sent emails per outcome."""
    return store.count_outcomes(campaign.id)


def campaign_suppressed(store: SuppressionList, campaign: Campaign) -> int:
    """The campaign's emails cancelled because their address is suppressed."""
    return store.count_suppressed_tasks(campaign.id)


def campaign_moves(store: Tasks, campaign: Campaign) -> tuple[int, int]:
    """``(moved, late)`` of the campaign: :data:`LATE_SECONDS` is late."""
    return store.count_moves(campaign.id, late_after=LATE_SECONDS)


class TaskView(_View):
    """One email of a campaign (``campaign tasks --json``)."""

    id: str
    position: int
    step: int = Field(1, description="its step in the campaign's sequence; 1: the first email")
    email: str
    name: str
    subject: str
    sender: str | None = Field(
        description="the address it goes out from: its sender's, or the campaign's From"
    )
    sender_name: str | None = Field(
        None,
        description='the display name of its sender ("": none); null without a sender (the '
        "campaign's From carries its own)",
    )
    timezone: str | None = Field(
        description="the recipient's own zone, where a local-time campaign reads its windows; "
        "null: the campaign's"
    )
    state: str
    send_at: IsoTime | None = Field(
        description="when it goes out; null while its campaign is paused (paused is true)"
    )
    sent_at: IsoTime | None
    attempts: int
    message_id: str | None
    error: str | None
    planned_at: IsoTime | None = Field(description="the first send time planned for it")
    moves: int = Field(description="how many times it was moved to another slot")
    moved_reason: str | None = Field(description='why it last moved, e.g. "transient: 421 ..."')
    reason: str | None = Field(description='why it was cancelled, e.g. "suppressed: bounced"')
    outcome: str | None = Field(
        description="what happened after sending: null until sent, then accepted, bounced, "
        "complained, replied or unsubscribed"
    )
    outcome_detail: str | None = Field(
        description='what the feedback said, e.g. "5.1.1 smtp; 550 5.1.1 user unknown"'
    )
    outcome_at: IsoTime | None = Field(description="when the outcome was last set")
    paused: bool = Field(description="Pending in a paused campaign: no send time until resume")
    late: bool = Field(description=f"sent more than {LATE_SECONDS} s after its send time")

    @classmethod
    def of(
        cls,
        task: Task,
        *,
        campaign_paused: bool = False,
        from_addr: str | None = None,
        sender: SenderFields | None = None,
    ) -> TaskView:
        """The view of ``task``; with ``campaign_paused`` a Pending one shows as paused. A
        task without a sender goes out from its campaign's From: ``from_addr``. ``sender``
        (:class:`~sendqueue.services.senders.sender_of.SendersOf`) gives ``sender_name`` (of a task
        with a sender) and fills ``sender.*`` into the subject as the email carries it."""
        paused = campaign_paused and task.state is TaskState.PENDING
        subject = task.subject
        if sender is not None:
            subject = fill_sender(subject, "", None, sender).subject
        return cls(
            id=task.id,
            position=task.position,
            step=task.step,
            email=task.email,
            name=task.name,
            subject=subject,
            sender=task.sender or from_addr,
            sender_name=sender.name if sender is not None and task.sender_id else None,
            timezone=task.timezone,
            state=task.state.value,
            send_at=None if paused else iso(task.send_at),
            sent_at=iso(task.sent_at),
            attempts=task.attempts,
            message_id=task.message_id,
            error=task.error,
            planned_at=iso(task.planned_at),
            moves=task.moves,
            moved_reason=task.moved_reason,
            reason=task.reason,
            outcome=task.outcome.value if task.outcome is not None else None,
            outcome_detail=task.outcome_detail,
            outcome_at=iso(task.outcome_at),
            paused=paused,
            late=is_late(task),
        )


def is_late(task: Task) -> bool:
    """Sent more than :data:`LATE_SECONDS` after its send time."""
    return task.sent_at is not None and (
        (task.sent_at - task.send_at).total_seconds() > LATE_SECONDS
    )


class ChangeView(_View):
    """A change-log entry, as the live stream sends it."""

    id: int
    campaign_id: str
    task_id: str | None
    from_state: str | None = Field(alias="from")
    to_state: str = Field(alias="to")
    at: IsoTime
    note: str | None

    @classmethod
    def of(cls, entry: ChangeLogEntry) -> ChangeView:
        return cls(
            id=entry.id,
            campaign_id=entry.campaign_id,
            task_id=entry.task_id,
            from_state=entry.from_state,
            to_state=entry.to_state,
            at=iso(entry.at),
            note=entry.note,
        )


class DeadLetterView(_View):
    """An invocation the execution layer gave up on (``dlq list --json``)."""

    id: str
    schedule: str
    group: str
    payload: dict[str, str]
    error: str
    attempts: int
    failed_at: IsoTime

    @classmethod
    def of(cls, letter: DeadLetter) -> DeadLetterView:
        return cls(
            id=letter.id,
            schedule=letter.schedule_name,
            group=letter.group,
            payload=dict(letter.payload),
            error=letter.error,
            attempts=letter.attempts,
            failed_at=iso(letter.failed_at),
        )


class SuppressionView(_View):
    """An address on the suppression list (``suppression list --json``)."""

    email: str = Field(description="the address as compared: case-folded")
    reason: str = Field(description="unsubscribed, bounced, complained, replied or manual")
    task_id: str | None = Field(description="the task it came from, if any")
    at: IsoTime

    @classmethod
    def of(cls, entry: Suppression) -> SuppressionView:
        return cls(
            email=entry.email, reason=entry.reason.value, task_id=entry.task_id, at=iso(entry.at)
        )


def campaign_dict(store: CampaignCounts, campaign: Campaign) -> dict[str, Any]:
    """A campaign with its task counts per state, moved and late, read from ``store``."""
    return CampaignView.read(store, campaign).as_json()


def task_dict(
    task: Task,
    *,
    campaign_paused: bool = False,
    from_addr: str | None = None,
    sender: SenderFields | None = None,
) -> dict[str, Any]:
    """A task as the API and ``task cancel --json`` show it (``from_addr``: the campaign's
    From, the ``sender`` of a task without one; ``sender``: see :meth:`TaskView.of`)."""
    view = TaskView.of(task, campaign_paused=campaign_paused, from_addr=from_addr, sender=sender)
    return view.as_json()


def change_dict(entry: ChangeLogEntry) -> dict[str, Any]:
    """A change-log entry, as the live stream sends it."""
    return ChangeView.of(entry).as_json()


def dead_letter_dict(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as ``dlq list --json`` prints it."""
    return DeadLetterView.of(letter).as_json()


#: The keys ``campaign tasks --json`` lists, in order: a task without position, name and subject.
TASK_LIST_KEYS = (
    "id", "email", "sender", "timezone", "state", "send_at", "sent_at", "attempts", "message_id",
    "error", "planned_at", "moves", "moved_reason", "reason", "outcome", "outcome_detail",
    "outcome_at", "paused", "late",
)  # fmt: skip


def task_list_dict(
    task: Task,
    *,
    campaign_paused: bool = False,
    from_addr: str | None = None,
    sender: SenderFields | None = None,
) -> dict[str, Any]:
    """A task as ``campaign tasks --json`` lists it: :func:`task_dict` cut to TASK_LIST_KEYS."""
    full = task_dict(task, campaign_paused=campaign_paused, from_addr=from_addr, sender=sender)
    return {key: full[key] for key in TASK_LIST_KEYS}
