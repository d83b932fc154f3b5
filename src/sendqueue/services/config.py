"""Plain values the services need, built from Settings by the composition root."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sendqueue.domain.unsubscribe import UnsubscribeLinks

__all__ = ["ServiceConfig"]


@dataclass(frozen=True)
class ServiceConfig:
    """Behaviour knobs of the service layer (docs/settings.md lists each)."""

    max_attempts: int = 3
    retry_backoff: float = 60.0
    auto_pause_after: int = 5
    stale_after: float = 900.0
    stale_policy: Literal["retry", "fail"] = "retry"
    #: seconds past send_at after which a send is re-planned instead of sent (catch-up)
    max_lateness: float = 300.0
    #: a late send within half the spacing of another send of its campaign is moved, not sent
    space_late_sends: bool = True
    provision_concurrency: int = 10
    #: recipients per provisioning chunk (one plan, one write, one checkpoint): 1,000 halves
    #: the per-chunk reads and transactions of 500 (docs/performance.md), and a chunk of
    #: EventBridge calls at 10 in flight still ends well inside the lease and the margin
    provision_chunk: int = 1000
    provision_margin: float = 90.0
    #: renewed after every chunk: a provisioning run whose process died blocks others this long
    provision_lease_seconds: float = 60.0
    reconcile_lease_seconds: float = 120.0
    #: seconds; the execution layer may fire a schedule from the start of the slot this long
    #: that holds its time (EventBridge: 60, the minute); 0: never before its time
    firing_precision: float = 0.0
    default_timezone: str = "Europe/Berlin"
    default_from: str = "sendqueue@example.com"
    #: how every email's List-Unsubscribe link is made; None: no links (development only)
    unsubscribe: UnsubscribeLinks | None = None
    #: the envelope sender of every email, VERP-encoded per task (None: the From)
    bounce_address: str | None = None
    #: SENDQUEUE_SECRET_KEY, which signs the VERP addresses, the unsubscribe links and the
    #: Message-IDs
    secret_key: str | None = field(default=None, repr=False)
    #: the authserv-ids whose Authentication-Results prove a reply's From (the feedback
    #: mailbox's), and those trusted in the senders' own mailboxes (another server may keep a
    #: header forged with the feedback mailbox server's id)
    trusted_authserv: frozenset[str] = frozenset()
    sender_mailbox_authserv: frozenset[str] = frozenset()
    #: seconds between two polls of the feedback mailboxes (the worker process)
    feedback_interval: float = 60.0
    #: seconds a poll of one mailbox holds its lease (renewed after every batch)
    feedback_lease_seconds: float = 300.0
