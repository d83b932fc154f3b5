"""The one-click unsubscribe: what the public ``/u/<token>`` routes call.

:meth:`UnsubscribeService.look_up` checks a token and says whose it is (the confirmation page);
:meth:`UnsubscribeService.unsubscribe` applies it through the feedback service: the task's
outcome becomes ``unsubscribed``, the address goes on the suppression list and its other
Pending emails are cancelled with the reason "suppressed: unsubscribed". Both raise
:class:`~sendqueue.domain.errors.NotFound` for a forged, altered or malformed token, a token of
a task that no longer exists, or when links are not configured, and then change nothing.
Unsubscribing twice is harmless: the second time finds the address listed and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from sendqueue.domain.errors import NotFound
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.models import Task
from sendqueue.domain.suppression import Suppression
from sendqueue.domain.unsubscribe import UnsubscribeLinks
from sendqueue.ports import Campaigns, Clock, SenderStore, SuppressionList
from sendqueue.services.feedback.effects import FeedbackService
from sendqueue.services.senders.sender_of import SendersOf

__all__ = ["UnsubscribeService", "Unsubscription", "mask_address"]


@dataclass(frozen=True)
class Unsubscription:
    """Whose a token is, for the page: the ``task_id``, the ``address`` masked
    (``j***@example.com``: the link may have been forwarded), the ``sender`` the email came
    from (``Name <address>``: the task's sender, or the campaign's From),
    whether the address is ``unsubscribed`` (on the suppression list, for whatever reason),
    and the Pending emails this request ``cancelled``."""

    task_id: str
    address: str
    sender: str
    unsubscribed: bool
    cancelled: int = 0


class UnsubscribeService:
    """Checks unsubscribe tokens and applies them (see the module docstring)."""

    def __init__(
        self,
        links: UnsubscribeLinks | None,
        store: Campaigns,
        suppressions: SuppressionList,
        feedback: FeedbackService,
        clock: Clock,
        *,
        senders: SenderStore,
    ) -> None:
        self._links = links
        self._store = store
        self._senders = senders
        self._suppressions = suppressions
        self._feedback = feedback
        self._clock = clock

    def _task(self, token: str) -> tuple[Task, Suppression | None]:
        """The token's task and its address's list entry (one read where the store can)."""
        task_id = self._links.task_of(token) if self._links is not None else None
        task, listed = self._suppressions.task_and_suppression(task_id) if task_id else (None, None)
        if task is None:
            # One answer for every refusal: a prober learns nothing about which ids exist.
            raise NotFound("unsubscribe link", token[:100])
        return task, listed

    def look_up(self, token: str) -> Unsubscription:
        """Whose ``token`` is, and whether the address is already unsubscribed; changes
        nothing (a GET: link scanners prefetch links)."""
        task, listed = self._task(token)
        return self._describe(task, unsubscribed=listed is not None)

    def unsubscribe(self, token: str) -> Unsubscription:
        """Apply the unsubscribe of ``token`` at once (see the module docstring)."""
        task, _ = self._task(token)
        applied = self._feedback.apply(
            Feedback(kind=FeedbackKind.UNSUBSCRIBE, task_id=task.id, at=self._clock.now())
        )
        return self._describe(task, unsubscribed=True, cancelled=len(applied.cancelled))

    def _describe(self, task: Task, *, unsubscribed: bool, cancelled: int = 0) -> Unsubscription:
        campaign = self._store.get_campaign(task.campaign_id)
        sender = SendersOf(self._senders, campaign).of(task).shown
        return Unsubscription(task.id, mask_address(task.email), sender, unsubscribed, cancelled)


def mask_address(email: str) -> str:
    """``jane@example.com`` -> ``j***@example.com``: enough to recognise, not to harvest."""
    local, at, domain = email.rpartition("@")
    if not at:
        return "***"
    return f"{local[:1]}***@{domain}"
