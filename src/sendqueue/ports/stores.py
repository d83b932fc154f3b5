"""What a storage backend is, typed: :class:`StoreBackend` names the rule that one backend's
store keeps every aggregate (tasks, campaigns, the change log, leases, counters, the
suppression list, the feedback loop's state, senders and their bookings, webhooks) in one
database, and :class:`Stores` is the bundle the composition root builds from it once, so each
service is handed only the ports it uses.

Nothing here changes a transaction: each port's method commits as its contract says, and
nothing spans two ports' calls. Every name is importable from :mod:`sendqueue.ports` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sendqueue.ports.feedback import FeedbackCursors, FeedbackOutcomes, FeedbackStore
from sendqueue.ports.reads import CampaignReads
from sendqueue.ports.senders import SenderStore
from sendqueue.ports.sequences import FollowUpMarks, SequenceEdits
from sendqueue.ports.suppressions import SuppressionList
from sendqueue.ports.tasks import Campaigns, ChangeLog, Counters, Leases, TaskStore
from sendqueue.ports.webhooks import WebhookStore

__all__ = ["StoreBackend", "Stores"]


class StoreBackend(
    TaskStore,
    SuppressionList,
    FeedbackStore,
    SenderStore,
    WebhookStore,
    CampaignReads,
    SequenceEdits,
    FollowUpMarks,
    Protocol,
):
    """One backend's store: every aggregate's port, in one database (the SQL stores, the
    DynamoDB store and the in-memory fake each are one)."""


@dataclass(frozen=True)
class Stores:
    """Every aggregate's port of one backend: what the composition root hands out.

    ``tasks`` is the task store whole (campaigns, tasks, change log, leases, counters: a task's
    change and its change-log entry commit together), for the services that read a campaign and
    change its tasks; a service is handed it typed as the ports it uses
    (:class:`~sendqueue.ports.tasks.CampaignTasks`, :class:`~sendqueue.ports.tasks.Tasks`, ...).
    The other fields are each one aggregate's port. Built with :meth:`of`.
    """

    tasks: TaskStore
    campaigns: Campaigns
    changes: ChangeLog
    leases: Leases
    counters: Counters
    suppressions: SuppressionList
    feedback: FeedbackOutcomes
    cursors: FeedbackCursors
    senders: SenderStore
    webhooks: WebhookStore

    @classmethod
    def of(cls, backend: StoreBackend) -> Stores:
        """The bundle of one backend's store, which fills every field: the type checker checks
        it against each field's port."""
        return cls(
            tasks=backend,
            campaigns=backend,
            changes=backend,
            leases=backend,
            counters=backend,
            suppressions=backend,
            feedback=backend,
            cursors=backend,
            senders=backend,
            webhooks=backend,
        )

    def close(self) -> None:
        """Close the backend (every field is its store)."""
        self.tasks.close()
