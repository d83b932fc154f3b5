"""The seams of sendqueue: what the services need from the outside world.

Each port is a :class:`typing.Protocol`. Its docstring is the contract every adapter honours and
the contract tests in ``tests/contract`` check, against the in-memory fakes in
:mod:`sendqueue.testing` and against every real adapter.

- :class:`TaskStore` is the source of truth: campaigns, recipients, tasks, the change log, leases,
  counters.
- :class:`Scheduler` is the execution layer: one one-time schedule per task, shaped like
  EventBridge Scheduler, with retries and a dead-letter queue.
- :class:`Dispatcher` runs a scheduler's due schedules against a target in this process (the
  embedded and procrastinate layers have one; on AWS, Lambda is the dispatcher).
- :class:`SuppressionList` is the global list of addresses never to send to (every task store
  keeps it too).
- :class:`FeedbackStore` keeps what feedback needs: task outcomes, the tasks of an address,
  transient bounces, and each feedback mailbox's position (every task store keeps it too).
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
runtime-checkable protocols :class:`BulkScheduler`, :class:`FlushableAlarm` and
:class:`~sendqueue.ports.probes.Probe` (what ``sendqueue check`` can try) name what only some
adapters can do.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from sendqueue.domain.alarms import AlarmItem, AutoPause
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import (
    Campaign,
    ChangeLogEntry,
    DeadLetter,
    Move,
    Recipient,
    Task,
    TaskChanges,
)
from sendqueue.domain.sendclaim import ClaimRefusal, SendClaim, SendFinish
from sendqueue.domain.senders import Booking
from sendqueue.domain.suppression import Suppression, key_of_normalized
from sendqueue.ports.feedback import FeedbackMessage, FeedbackSource, FeedbackStore
from sendqueue.ports.oauth import AccessToken, AccessTokens
from sendqueue.ports.probes import Probe
from sendqueue.ports.scheduler import (
    BulkScheduler,
    CreateArgs,
    Dispatcher,
    Schedule,
    Scheduler,
    Target,
)
from sendqueue.ports.senders import SenderStore
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
    "BulkScheduler",
    "ClaimRefusal",
    "Clock",
    "CreateArgs",
    "Dispatcher",
    "EndpointChanges",
    "Events",
    "FeedbackMessage",
    "FeedbackSource",
    "FeedbackStore",
    "FlushableAlarm",
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
    "SuppressionList",
    "Target",
    "TaskStore",
    "WebhookAlarm",
    "WebhookResponse",
    "WebhookStore",
    "WebhookTransport",
]


class Clock(Protocol):
    """Tells the time. ``now()`` is aware, in UTC."""

    def now(self) -> datetime: ...


class TaskStore(Protocol):
    """Durable campaigns, recipients and tasks; the source of truth.

    Contract:

    - Every task state change is a compare-and-set on the current state. It returns the updated
      task, or None when the task was not in ``expected`` (someone else changed it first). The
      change is appended to the change log in the same transaction, so a reader of the log never
      misses a change and never sees one that did not happen.
    - Only transitions in :data:`sendqueue.domain.lifecycle.TASK_TRANSITIONS` are attempted;
      the store raises :class:`~sendqueue.domain.errors.IllegalTransition` for any other.
    - ``create_campaign`` stores the campaign and all its recipients in one transaction, or
      nothing. ``recipients`` may be any iterable, consumed once and in chunks, so a million
      recipients need not be in memory at once; ``recipient_count`` is stored as the number
      consumed. The campaign is visible only once every recipient is stored: SQL stores insert
      in one transaction, DynamoDB writes the campaign item last (its commit point) and deletes
      what it wrote when a recipient is refused. Two recipients with one position raise
      InvalidField (``position``), an existing id Conflict.
    - ``insert_tasks`` is idempotent: a task whose id exists is left untouched and not counted.
      Each inserted task gets a change-log entry ``None -> Pending``.
    - Paging is by cursor (position or id), never by offset.
    - Change-log ids are strictly increasing; ``changes_after(n)`` returns entries with id > n
      in id order.
    - Counters are named integers shared by every process on the store: ``counter(name)`` is 0
      until ``increment_counter(name)`` first runs; an increment is atomic (two processes that
      increment at once both count) and returns the new value, read back in the same write.
      Counters only go up. The web app keeps its session generation in one (logout bumps it).
    - An unreachable or failing backend raises
      :class:`~sendqueue.domain.errors.StoreUnavailable`; unknown ids raise
      :class:`~sendqueue.domain.errors.NotFound` where a method says so.
    - Every task store is a :class:`SuppressionList` too, in the same database, and
      ``insert_tasks`` also takes tasks that are Cancelled with a ``reason`` (a suppressed
      recipient's), logged ``None -> Cancelled`` with the reason as the note.
    """

    # campaigns
    def create_campaign(self, campaign: Campaign, recipients: Iterable[Recipient]) -> None: ...

    def get_campaign(self, campaign_id: str) -> Campaign:
        """The campaign, or NotFound."""
        ...

    def list_campaigns(self) -> list[Campaign]:
        """All campaigns, newest first."""
        ...

    def set_campaign_state(
        self,
        campaign_id: str,
        expected: Collection[CampaignState],
        new: CampaignState,
        *,
        at: datetime,
        reason: str | None = None,
    ) -> bool:
        """Compare-and-set the campaign state (and its reason); logged. NotFound if unknown."""
        ...

    def save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        *,
        at: datetime,
        note: str | None = None,
    ) -> None:
        """Store the provisioning checkpoint; with ``note``, log a ``progress`` entry."""
        ...

    # recipients
    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        """Recipients with position > ``after``, in position order."""
        ...

    # tasks
    def insert_tasks(
        self, tasks: Sequence[Task], *, at: datetime, bookings: Sequence[Booking] = ()
    ) -> int:
        """Insert tasks that do not exist yet (by id), in one transaction. Returns how many.

        With ``bookings`` (the new tasks' sender slots), they are booked as
        :meth:`SenderStore.book` books them, in the same write: on Overbooked nothing is booked
        and no task inserted. SQL stores do both in one transaction; DynamoDB books first (its
        own atomic write) and then inserts, so a crash in between leaves bookings without their
        tasks, which the resumed run moves.
        """
        ...

    def get_task(self, task_id: str) -> Task | None: ...

    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]:
        """The tasks of ``task_ids`` that exist, by id (an unknown id is left out), each as
        current as :meth:`get_task` would read it; a batch of reads, not one per id."""
        ...

    def transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        changes: TaskChanges | None = None,
        note: str | None = None,
    ) -> Task | None:
        """Compare-and-set one task's state, applying ``changes`` too. None if not applied."""
        ...

    def transition_all(
        self,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        note: str | None = None,
    ) -> int:
        """Move every task of the campaign in ``expected`` to ``new`` (each logged)."""
        ...

    def reschedule(self, moves: Sequence[Move], *, at: datetime, reason: str) -> int:
        """Move Pending tasks to other slots: each :class:`Move` applies only while its task is
        Pending and still holds ``move.token`` (a compare-and-set), and sets ``send_at``, the
        new token, ``moves + 1`` and ``moved_reason = reason``.

        Each moved task gets a change-log entry ``Pending -> Pending`` with the note
        ``"moved: <reason>"`` in the same write (not a lifecycle transition: the state stays).
        Tasks no longer Pending, or re-tokened meanwhile, are left alone. Returns how many
        moved.
        """
        ...

    def list_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
    ) -> list[Task]:
        """A page of the campaign's tasks with position > ``after``, in position order.

        ``search`` matches a case-insensitive substring of the address.
        """
        ...

    def due_tasks(
        self,
        state: TaskState,
        *,
        before: datetime,
        after: tuple[datetime, str] | None = None,
        limit: int = 1000,
    ) -> list[Task]:
        """Tasks in ``state`` with send_at < ``before``, ordered by (send_at, id), after cursor."""
        ...

    def stale_running(self, *, claimed_before: datetime, limit: int = 1000) -> list[Task]:
        """Running tasks claimed before ``claimed_before``, oldest claim first."""
        ...

    def booked(
        self, campaign_id: str, *, since: datetime, until: datetime | None = None
    ) -> list[tuple[TaskState, datetime]]:
        """What the campaign has sent or will send in ``[since, until)`` (no end: ``None``):
        ``(Finished, sent_at)``, ``(Running, claimed_at)`` and ``(Pending, send_at)``, in no
        particular order. The planner counts them against ``per_day`` and keeps moved sends
        away from them. Empty for an unknown campaign.
        """
        ...

    def claim_for_send(
        self,
        task_id: str,
        *,
        token: str | None,
        at: datetime,
        due_by: datetime,
        not_before: datetime | None = None,
    ) -> SendClaim:
        """The send worker's claim, one statement or transaction: Pending -> Running (with
        ``claimed_at = at``, ``attempts + 1`` and its change-log entry) only when
        :func:`~sendqueue.domain.sendclaim.claim_refusal` finds nothing against it, read in
        the same write (the token, the state, ``send_at <= due_by``, the campaign sending, the
        address not suppressed, ``send_at >= not_before``); else nothing is written and the
        answer says why. The answer carries the campaign's state and the task's booking instant
        as read. PostgreSQL and SQLite: one round trip; DynamoDB: one consistent batch read and
        one transaction."""
        ...

    def finish_send(
        self, task_id: str, *, at: datetime, message_id: str, slot: datetime | None = None
    ) -> SendFinish:
        """The send worker's finish, one statement or transaction: Running -> Finished with
        ``sent_at = outcome_at = at``, the message id, outcome accepted and no error, logged;
        with ``slot`` (the claimed task's send_at), the task's booking at that instant is
        counted sent in the same write (``SenderStore.mark_sent``). Also tells whether the
        campaign has other Pending tasks. DynamoDB runs these as consecutive writes."""
        ...

    def campaign_state(self, campaign_id: str) -> CampaignState:
        """Only the campaign's current state (cheaper than get_campaign); NotFound if unknown.

        The send worker reads it fresh around every claim, so a pause stops sends at once.
        """
        ...

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        """Whether any task of the campaign is Pending or Running (False for an unknown one)."""
        ...

    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]:
        """Number of tasks per state; every state is present, zero included."""
        ...

    def count_moves(self, campaign_id: str, *, late_after: float) -> tuple[int, int]:
        """``(moved, late)``: how many of the campaign's tasks were moved at least once, and
        how many Finished ones went out more than ``late_after`` seconds after their send
        time. (0, 0) for an unknown campaign.
        """
        ...

    # change log
    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]: ...

    def last_change_id(self) -> int:
        """The highest change-log id ``changes_after`` can return now, 0 when the log is
        empty. A stream that starts here misses nothing."""
        ...

    def newest_change_id(self) -> int:
        """The highest change-log id committed, 0 when the log is empty. Past
        ``last_change_id`` only while the store holds committed entries back behind a
        transaction still in flight (PostgreSQL); the live stream compares it with its
        position to tell clients it is behind."""
        ...

    # leases (one reconciler pass at a time, across processes)
    def acquire_lease(self, name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        """Take or renew the named lease if it is free, expired or already ours."""
        ...

    def release_lease(self, name: str, owner: str) -> None: ...

    # counters (e.g. the web's session generation, bumped by logout)
    def counter(self, name: str) -> int:
        """The counter's value, read consistently; 0 for one never incremented."""
        ...

    def increment_counter(self, name: str) -> int:
        """Add one to the counter atomically (creating it at 1); returns the new value."""
        ...

    def close(self) -> None: ...


class SuppressionList(Protocol):
    """The global suppression list: addresses never to send to. Every task store
    implements it, in the same database, so the send path reads it without another service.

    Contract:

    - Addresses are handed in and out in their compared form
      (:func:`sendqueue.domain.suppression.suppression_key`: validated, case-folded); the store
      compares them exactly. The services make the keys.
    - ``suppress`` is insert-or-keep: an address already on the list keeps its first entry
      (reason, task, time), and of two entries for one address in one call the first is kept.
      It returns how many addresses were new. Concurrent calls for one new address: exactly one
      counts it.
    - ``suppressed`` looks a batch up in one query per chunk (never one per address) and
      returns the entries found, keyed by address; addresses not on the list are left out.
    - ``list_suppressions`` pages by address (``after``: the last address of the previous page),
      in address order. ``limit`` below zero raises InvalidField.
    - ``count_suppressed_tasks`` counts the campaign's tasks cancelled because of the list (their
      ``reason`` starts with "suppressed"); 0 for an unknown campaign.
    - ``task_and_suppression`` reads a task as ``TaskStore.get_task`` does, and the entry of its
      address (``key_of_normalized(task.email)``): PostgreSQL in one statement, the others with
      two local or cheap reads.
    - An unreachable backend raises :class:`~sendqueue.domain.errors.StoreUnavailable`.
    """

    def suppress(self, entries: Sequence[Suppression]) -> int:
        """Add the entries whose address is not on the list yet; returns how many were new."""
        ...

    def unsuppress(self, email: str) -> bool:
        """Remove the address; False if it was not on the list."""
        ...

    def suppressed(self, emails: Iterable[str]) -> dict[str, Suppression]:
        """The entries of those of ``emails`` on the list, keyed by address."""
        ...

    def list_suppressions(self, *, after: str | None = None, limit: int = 100) -> list[Suppression]:
        """A page of entries with address > ``after``, in address order."""
        ...

    def count_suppressions(self) -> int:
        """How many addresses are on the list."""
        ...

    def count_suppressed_tasks(self, campaign_id: str) -> int:
        """The campaign's tasks whose ``reason`` starts with "suppressed"."""
        ...

    def task_and_suppression(self, task_id: str) -> tuple[Task | None, Suppression | None]:
        """The task (None if unknown) and the list's entry for its address (None if it is
        not listed): the send worker's first read, in one round trip where the store can."""
        ...


class _TaskAndListReads(Protocol):
    def get_task(self, task_id: str) -> Task | None: ...

    def suppressed(self, emails: Iterable[str]) -> dict[str, Suppression]: ...


class ReadsTaskThenSuppression:
    """``SuppressionList.task_and_suppression`` as two reads, ``get_task`` and then
    ``suppressed`` of the task's address: for stores where the second read is local or cheap
    (memory, SQLite, DynamoDB). PostgreSQL answers both in one statement instead."""

    def task_and_suppression(
        self: _TaskAndListReads, task_id: str
    ) -> tuple[Task | None, Suppression | None]:
        task = self.get_task(task_id)
        if task is None:
            return None, None
        key = key_of_normalized(task.email)
        return task, self.suppressed([key]).get(key)


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
