"""The seams of sendqueue: what the services need from the outside world.

Each port is a :class:`typing.Protocol`. Its docstring is the contract every adapter honours and
the contract tests in ``tests/contract`` check, against the in-memory fakes in
:mod:`sendqueue.testing` and against every real adapter.

- :class:`TaskStore` is the source of truth: one port per aggregate (:class:`Campaigns` with
  their recipients, :class:`Tasks`, :class:`ChangeLog`, :class:`Leases`, :class:`Counters`, in
  :mod:`sendqueue.ports.tasks`), and TaskStore all of them together.
- :class:`~sendqueue.ports.stores.StoreBackend` is one backend's store, which keeps every
  aggregate below too; :class:`~sendqueue.ports.stores.Stores` is the bundle of its ports the
  composition root builds once and hands out, each service taking only the ports it uses.
- :class:`Scheduler` is the execution layer: one one-time schedule per task, shaped like
  EventBridge Scheduler, with retries and a dead-letter queue.
- :class:`Dispatcher` runs a scheduler's due schedules against a target in this process (the
  embedded and procrastinate layers have one; on AWS, Lambda is the dispatcher).
- :class:`SuppressionList` is the global list of addresses never to send to (every task store
  keeps it too; :mod:`sendqueue.ports.suppressions`).
- :class:`FeedbackStore` keeps what feedback needs: :class:`FeedbackOutcomes` (task outcomes,
  the tasks of an address, transient bounces) and :class:`FeedbackCursors` (each feedback
  mailbox's position and passes); every task store keeps it too.
- :class:`FeedbackSource` yields the messages of a feedback mailbox once each.
- :class:`Mailer` hands one message to a mail provider.
- :class:`Alarm` is raised when an invocation lands in the dead-letter queue or the send worker
  pauses a campaign after too many failures in a row.
- :class:`Events` hears what happened (sends, dead letters, alarms, repairs), for the metrics.
- :class:`Clock` tells the time, so tests can run on a fake one.
- :class:`~sendqueue.ports.webhooks.WebhookStore` keeps webhook endpoints, their delivery
  positions and the delivery log (every task store keeps them too);
  :class:`~sendqueue.ports.webhooks.WebhookTransport` POSTs one signed delivery.
- :class:`~sendqueue.ports.senders.SenderStore` keeps senders and the slots their sends book
  (every task store keeps them too).
- :class:`~sendqueue.ports.oauth.AccessTokens` hands out each sender's OAuth 2.0
  :class:`~sendqueue.ports.oauth.AccessToken`, which its SMTP and IMAP sign in with.

The execution layer's ports live in :mod:`sendqueue.ports.scheduler` and the senders' in
:mod:`sendqueue.ports.senders`; every name is importable from here.

Optional abilities are declared, never discovered with ``getattr``: ``Scheduler.firing_precision``
and ``Dispatcher.runs_reconciler`` are attributes every adapter sets, and the small
runtime-checkable protocols :class:`BulkScheduler`, :class:`BackgroundBulkScheduler`,
:class:`FlushableAlarm` and
:class:`~sendqueue.ports.probes.Probe` (what ``sendqueue check`` can try) name what only some
adapters can do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from sendqueue.domain.alarms import AlarmItem, AutoPause
from sendqueue.domain.models import DeadLetter
from sendqueue.domain.sendclaim import ClaimRefusal, SendClaim, SendFinish
from sendqueue.ports.feedback import (
    FeedbackCursors,
    FeedbackMessage,
    FeedbackOutcomes,
    FeedbackSource,
    FeedbackStore,
)
from sendqueue.ports.oauth import AccessToken, AccessTokens
from sendqueue.ports.probes import Probe
from sendqueue.ports.scheduler import (
    BackgroundBulkScheduler,
    BulkScheduler,
    CreateArgs,
    Dispatcher,
    DueArgs,
    Schedule,
    Scheduler,
    Target,
)
from sendqueue.ports.senders import SenderStore
from sendqueue.ports.sequences import (
    FollowUpMarks,
    FollowUpStore,
    SequenceEdits,
    SequenceStore,
)
from sendqueue.ports.stores import StoreBackend, Stores
from sendqueue.ports.suppressions import ReadsTaskThenSuppression, SuppressionList
from sendqueue.ports.tasks import (
    Campaigns,
    CampaignTasks,
    ChangeLog,
    Counters,
    LeasedCampaignTasks,
    Leases,
    Tasks,
    TaskStore,
)
from sendqueue.ports.webhooks import (
    EndpointChanges,
    WebhookAlarm,
    WebhookResponse,
    WebhookStore,
    WebhookTransport,
)

__all__ = [
    "AccessToken",
    "AccessTokens",
    "Alarm",
    "BackgroundBulkScheduler",
    "BulkScheduler",
    "CampaignTasks",
    "Campaigns",
    "ChangeLog",
    "ClaimRefusal",
    "Clock",
    "Counters",
    "CreateArgs",
    "Dispatcher",
    "DueArgs",
    "EndpointChanges",
    "Events",
    "FeedbackCursors",
    "FeedbackMessage",
    "FeedbackOutcomes",
    "FeedbackSource",
    "FeedbackStore",
    "FlushableAlarm",
    "FollowUpMarks",
    "FollowUpStore",
    "LeasedCampaignTasks",
    "Leases",
    "Mailer",
    "NoEvents",
    "OutgoingMessage",
    "Probe",
    "ReadsTaskThenSuppression",
    "Schedule",
    "Scheduler",
    "SendClaim",
    "SendFinish",
    "SendOutcome",
    "SenderStore",
    "SequenceEdits",
    "SequenceStore",
    "StoreBackend",
    "Stores",
    "SuppressionList",
    "Target",
    "TaskStore",
    "Tasks",
    "WebhookAlarm",
    "WebhookResponse",
    "WebhookStore",
    "WebhookTransport",
]


class Clock(Protocol):
    """Tells the time. ``now()`` is aware, in UTC."""

    def now(self) -> datetime: ...


@dataclass(frozen=True)
class OutgoingMessage:
    """One email ready to hand to a provider. ``message_id`` is derived from the task id."""

    message_id: str
    from_addr: str
    """The From address; with ``from_name`` None it may carry the name (``Name <addr>``)."""
    to_addr: str
    subject: str
    text: str
    date: datetime
    to_name: str = ""
    from_name: str | None = None
    """The From's display name, given apart from the bare ``from_addr`` (a sender's name, which
    may hold ``,``, ``:`` or non-ASCII: the MIME builder quotes and encodes it)."""
    reply_to: str | None = None
    html: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    envelope_from: str | None = None
    """The SMTP envelope sender (Return-Path), e.g. a VERP bounce address; None: the From."""


class Mailer(Protocol):
    """Hands messages to a mail provider.

    ``send`` returns the accepted Message-ID, or raises TransientMailError (4xx, connection
    errors, timeouts) or PermanentMailError (5xx). Safe to call from several threads.
    """

    def send(self, message: OutgoingMessage) -> str: ...

    def close(self) -> None: ...


class Alarm(Protocol):
    """Tells a person that something needs them (log, metric, webhook, email).

    Raised when an invocation lands in the dead-letter queue (``raise_alarm``) and when the send
    worker pauses a campaign after too many permanent failures in a row (``auto_paused``).
    Both return at once and never raise: whatever reaches a person (a webhook, an email) goes
    out in the background, and its failures are logged, never handed to the caller.
    """

    def raise_alarm(self, letter: DeadLetter) -> None: ...

    def auto_paused(self, pause: AutoPause) -> None: ...


@runtime_checkable
class FlushableAlarm(Protocol):
    """An alarm that sends in the background and can wait for what it queued (at exit)."""

    def raise_alarm(self, letter: DeadLetter) -> None: ...

    def auto_paused(self, pause: AutoPause) -> None: ...

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued went out; False if ``timeout`` ran out first."""
        ...


#: How a send invocation ended: accepted, retried later, failed for good, not attempted
#: (the task was not Pending, the schedule stale or early, the campaign not sending), or moved
#: (too late, or outside the policy: re-planned with the campaign's other Pending tasks).
SendOutcome = Literal["sent", "transient", "permanent", "skipped", "moved"]


class Events(Protocol):
    """Hears what the services and adapters did, for the operators (metrics).

    Calls are cheap, thread-safe and never raise; they decide nothing.
    """

    def send_finished(self, outcome: SendOutcome, lateness: float | None = None) -> None:
        """A send invocation ended; ``lateness`` (seconds after send_at) when it was sent."""
        ...

    def dead_lettered(self, letter: DeadLetter) -> None:
        """The execution layer gave up on an invocation."""
        ...

    def alarm_raised(self, item: AlarmItem) -> None:
        """The alarm went off for ``item`` (a dead letter or an auto-paused campaign)."""
        ...

    def repaired(self, kind: str, n: int) -> None:
        """The reconciler repaired ``n`` drifts of ``kind``."""
        ...


class NoEvents:
    """The default :class:`Events`: hears nothing."""

    def send_finished(self, outcome: SendOutcome, lateness: float | None = None) -> None:
        pass

    def dead_lettered(self, letter: DeadLetter) -> None:
        pass

    def alarm_raised(self, item: AlarmItem) -> None:
        pass

    def repaired(self, kind: str, n: int) -> None:
        pass
