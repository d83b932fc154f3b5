"""The send worker's claim and finish as one store call each (``TaskStore.claim_for_send`` and
``TaskStore.finish_send``): what they answer, and the rule that decides whether a claim is
made. Pure, no I/O.

A store reads the task, its campaign's state, its address's suppression entry and its booking
(in one statement or transaction where it can), runs :func:`refused_claim` (the rule,
:func:`claim_refusal`, and its answer) on them, and claims only when it returns None; the
worker then acts on the refusal exactly as it acted on the same finding when it read first
and claimed after.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Task, utc
from sendqueue.domain.suppression import Suppression

__all__ = [
    "SENDING_STATES",
    "ClaimRefusal",
    "SendClaim",
    "SendFinish",
    "claim_refusal",
    "refused_claim",
]

#: Campaign states in which due tasks are sent. Provisioning counts: the first sends of a large
#: campaign may be due before its last schedules are created.
SENDING_STATES = frozenset({CampaignState.ACTIVE, CampaignState.PROVISIONING})


class ClaimRefusal(enum.Enum):
    """Why a claim was not made, in the order the rule checks."""

    NOT_FOUND = "not found"
    """No such task, or its campaign is gone (an orphan task): skipped as unknown."""
    STALE = "stale token"
    NOT_PENDING = "not pending"
    EARLY = "invoked before its firing slot"
    NOT_SENDING = "campaign not sending"
    SUPPRESSED = "address suppressed"
    LATE = "past its lateness limit"
    TAKEN = "changed by another writer first"
    """The task looked claimable but another write (a concurrent claim, a move) changed it
    between the read and the compare-and-set (PostgreSQL, where both are one statement)."""


@dataclass(frozen=True)
class SendClaim:
    """What ``claim_for_send`` answers.

    ``task``: the task Running (claimed: ``refused`` is None) or as found (None: unknown).
    ``campaign_state``: the campaign's state read with it (None when the task is unknown or
    its campaign is gone: NOT_FOUND).
    ``suppression``: the address's entry as read (None: not listed); always there when
    ``refused`` is SUPPRESSED.
    ``booking_at``: the instant of the task's booking (None: it holds none), read with it.
    """

    task: Task | None
    campaign_state: CampaignState | None
    refused: ClaimRefusal | None = None
    suppression: Suppression | None = None
    booking_at: datetime | None = None

    @property
    def claimed(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class SendFinish:
    """What ``finish_send`` answers.

    ``task``: the task Finished, or None when it was not Running (changed meanwhile).
    ``settled``: its booking at the given slot is counted sent (now, or already was), in the
    same write; False without a slot, or when the booking is not at that slot.
    ``pending_left``: the campaign had other Pending tasks when the finish was written (so it
    is certainly not done yet).
    """

    task: Task | None
    settled: bool = False
    pending_left: bool = False


def claim_refusal(
    task: Task | None,
    *,
    token: str | None,
    campaign_state: CampaignState | None,
    suppression: Suppression | None,
    due_by: datetime,
    not_before: datetime | None,
) -> ClaimRefusal | None:
    """Why ``task`` (as read, with its campaign's state and its address's entry) is not claimed
    for a send now; None: claim it. ``due_by`` is the latest send_at that is not early,
    ``not_before`` the earliest that is not past the lateness limit (None: no limit)."""
    if task is None:
        return ClaimRefusal.NOT_FOUND
    if token is not None and token != task.token:
        return ClaimRefusal.STALE
    if task.state is not TaskState.PENDING:
        return ClaimRefusal.NOT_PENDING
    if task.send_at > due_by:
        return ClaimRefusal.EARLY
    if campaign_state not in SENDING_STATES:
        return ClaimRefusal.NOT_SENDING
    if suppression is not None:
        return ClaimRefusal.SUPPRESSED
    if not_before is not None and task.send_at < not_before:
        return ClaimRefusal.LATE
    return None


def refused_claim(
    task: Task | None,
    campaign_state: CampaignState | None,
    *,
    token: str | None,
    suppression: Suppression | None,
    booking_at: datetime | None,
    due_by: datetime,
    not_before: datetime | None,
) -> SendClaim | None:
    """A store's answer when :func:`claim_refusal` refuses the claim on the values it read;
    None: claim it. A task unknown, or whose campaign is gone (None), is NOT_FOUND, as the
    SQL claim's join finds it."""
    if task is None or campaign_state is None:
        return SendClaim(None, None, ClaimRefusal.NOT_FOUND)
    refused = claim_refusal(
        task,
        token=token,
        campaign_state=campaign_state,
        suppression=suppression,
        due_by=utc(due_by),
        not_before=None if not_before is None else utc(not_before),
    )
    if refused is None:
        return None
    return SendClaim(task, campaign_state, refused, suppression, booking_at)
