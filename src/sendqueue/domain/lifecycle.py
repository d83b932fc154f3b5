"""Task and campaign states, and the only transitions between them.

Every task transition is applied in the store as a conditional write (compare-and-set on the
current state); these tables are what the store, the services and the tests agree on.
"""

from __future__ import annotations

import enum

from .errors import IllegalTransition, InvalidField

__all__ = [
    "CAMPAIGN_TRANSITIONS",
    "TASK_TRANSITIONS",
    "CampaignState",
    "StopOnReply",
    "TaskOutcome",
    "TaskState",
    "check_campaign_transition",
    "check_task_transition",
]


class TaskState(enum.StrEnum):
    """The state of one email. Values are spelled as the CLI and the API print them."""

    PENDING = "Pending"
    """Planned, waiting for its schedule to fire (or for a retry)."""
    RUNNING = "Running"
    """Claimed by a worker, which is sending it now."""
    FINISHED = "Finished"
    """Accepted by the mail provider. Final."""
    FAILED = "Failed"
    """Refused permanently, or out of attempts. Final unless the user retries failed ones."""
    CANCELLED = "Cancelled"
    """Cancelled before it was sent. Final."""

    @property
    def is_final(self) -> bool:
        """Finished, Failed and Cancelled: no worker will touch the task again by itself."""
        return self in _FINAL_TASK_STATES

    @classmethod
    def parse(cls, value: str, *, field: str = "state") -> TaskState:
        """The state spelled ``value`` in any case (surrounding blanks ignored).

        The one parser the CLI, the API, the pages and the stores share; anything else raises
        InvalidField naming ``field`` and listing the states.
        """
        wanted = value.strip().lower() if isinstance(value, str) else None
        for state in cls:
            if state.value.lower() == wanted:
                return state
        raise InvalidField(field, value, f"one of {', '.join(s.value for s in cls)}")


_FINAL_TASK_STATES = frozenset({TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED})


class CampaignState(enum.StrEnum):
    """The lifecycle of a campaign."""

    DRAFT = "draft"
    """Imported; recipients stored, nothing planned or scheduled yet."""
    PROVISIONING = "provisioning"
    """Tasks and schedules are being created (resumable from a checkpoint)."""
    ACTIVE = "active"
    """Schedules exist; workers send as they fire."""
    PAUSED = "paused"
    """Schedules of Pending tasks deleted; resume re-plans them from now."""
    COMPLETED = "completed"
    """No Pending or Running task is left."""
    CANCELLED = "cancelled"
    """Cancelled by the user; every Pending task was cancelled. Final."""

    @property
    def is_final(self) -> bool:
        """Only cancelled is final; a completed campaign may be re-activated by retry-failed."""
        return self is CampaignState.CANCELLED


#: (from, to) -> who makes that change. Anything not in this table is illegal.
TASK_TRANSITIONS: dict[tuple[TaskState, TaskState], str] = {
    (TaskState.PENDING, TaskState.RUNNING): "worker claim (campaign active)",
    (TaskState.RUNNING, TaskState.FINISHED): "worker: mail accepted",
    (TaskState.RUNNING, TaskState.FAILED): "worker: permanent error or attempts exhausted; "
    "reconciler: stale under policy fail",
    (TaskState.RUNNING, TaskState.PENDING): "worker: transient error with attempts left; "
    "reconciler: stale under policy retry",
    (TaskState.PENDING, TaskState.CANCELLED): "cancel (campaign or single task)",
    (TaskState.FAILED, TaskState.PENDING): "retry-failed",
}

_S = CampaignState
#: (from, to) -> why. Anything not in this table is illegal.
CAMPAIGN_TRANSITIONS: dict[tuple[CampaignState, CampaignState], str] = {
    (_S.DRAFT, _S.PROVISIONING): "provision",
    (_S.PROVISIONING, _S.ACTIVE): "provisioning finished",
    (_S.ACTIVE, _S.COMPLETED): "no Pending or Running task left",
    (_S.ACTIVE, _S.PAUSED): "pause (by the user, or automatically after repeated failures)",
    (_S.PAUSED, _S.ACTIVE): "resume",
    (_S.COMPLETED, _S.ACTIVE): "retry-failed on a completed campaign",
    (_S.DRAFT, _S.CANCELLED): "cancel",
    (_S.PROVISIONING, _S.CANCELLED): "cancel",
    (_S.ACTIVE, _S.CANCELLED): "cancel",
    (_S.PAUSED, _S.CANCELLED): "cancel",
}


def check_task_transition(current: TaskState, target: TaskState) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> target`` is in the table."""
    if (current, target) not in TASK_TRANSITIONS:
        raise IllegalTransition("task", current.value, target.value)


def check_campaign_transition(current: CampaignState, target: CampaignState) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> target`` is in the table."""
    if (current, target) not in CAMPAIGN_TRANSITIONS:
        raise IllegalTransition("campaign", current.value, target.value)


class TaskOutcome(enum.StrEnum):
    """What happened to a sent email (None on a task until it is sent)."""

    ACCEPTED = "accepted"
    """The provider accepted it, and nothing has been heard since."""
    BOUNCED = "bounced"
    """A permanent delivery failure came back (a 5.x.x DSN or an SES hard bounce)."""
    COMPLAINED = "complained"
    """The recipient marked it as spam (an ARF report or an SES complaint)."""
    REPLIED = "replied"
    """The recipient answered it (auto-replies do not count)."""
    UNSUBSCRIBED = "unsubscribed"
    """The recipient used its unsubscribe link or address."""

    @classmethod
    def parse(cls, value: object, *, field: str = "outcome") -> TaskOutcome:
        """The outcome spelled ``value`` in any case; InvalidField naming ``field`` otherwise."""
        wanted = value.strip().lower() if isinstance(value, str) else None
        for outcome in cls:
            if outcome.value == wanted:
                return outcome
        raise InvalidField(field, value, f"one of {', '.join(o.value for o in cls)}")


class StopOnReply(enum.StrEnum):
    """Which Pending emails of a recipient a reply cancels (a campaign option)."""

    SENDER = "sender"
    """Every active campaign sending from the same address (the default)."""
    CAMPAIGN = "campaign"
    """Only the campaign the reply answers."""
    OFF = "off"
    """None: the reply is recorded as the outcome and nothing else changes."""

    @classmethod
    def parse(cls, value: object, *, field: str = "stop_on_reply") -> StopOnReply:
        """The scope spelled ``value`` in any case; InvalidField naming ``field`` otherwise."""
        wanted = value.strip().lower() if isinstance(value, str) else None
        for scope in cls:
            if scope.value == wanted:
                return scope
        raise InvalidField(field, value, f"one of {', '.join(s.value for s in cls)}")
