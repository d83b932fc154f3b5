"""The task store's ports, one per aggregate: :class:`Campaigns` (campaigns and their
recipients), :class:`Tasks` (the tasks and their state machine), :class:`ChangeLog`,
:class:`Leases` and :class:`Counters`. :class:`TaskStore` is all of them together, as every
backend keeps them in one database (a task's change and its change-log entry commit together).

Every name is importable from :mod:`sendqueue.ports` too. Common to every port here: an
unreachable or failing backend raises :class:`~sendqueue.domain.errors.StoreUnavailable`;
unknown ids raise :class:`~sendqueue.domain.errors.NotFound` where a method says so; paging is
by cursor (position or id), never by offset.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import (
    Campaign,
    ChangeLogEntry,
    Move,
    Recipient,
    Task,
    TaskChanges,
)
from sendqueue.domain.reads import StepCounts
from sendqueue.domain.sendclaim import SendClaim, SendFinish
from sendqueue.domain.senders import Booking

__all__ = [
    "CampaignTasks",
    "Campaigns",
    "ChangeLog",
    "Counters",
    "LeasedCampaignTasks",
    "Leases",
    "TaskStore",
    "Tasks",
]


class Campaigns(Protocol):
    """Campaigns and their recipients.

    Contract:

    - ``create_campaign`` stores the campaign and all its recipients in one transaction, or
      nothing. ``recipients`` may be any iterable, consumed once and in chunks, so a million
      recipients need not be in memory at once; ``recipient_count`` is stored as the number
      consumed. The campaign is visible only once every recipient is stored: SQL stores insert
      in one transaction, DynamoDB writes the campaign item last (its commit point) and deletes
      what it wrote when a recipient is refused. Two recipients with one position raise
      InvalidField (``position``), an existing id Conflict.
    - A campaign state change is a compare-and-set, logged in the change log.
    """

    def create_campaign(self, campaign: Campaign, recipients: Iterable[Recipient]) -> None: ...

    def get_campaign(self, campaign_id: str) -> Campaign:
        """The campaign, or NotFound."""
        ...

    def list_campaigns(self) -> list[Campaign]:
        """All campaigns, newest first."""
        ...

    def campaign_state(self, campaign_id: str) -> CampaignState:
        """Only the campaign's current state (cheaper than get_campaign); NotFound if unknown.

        The send worker reads it fresh around every claim, so a pause stops sends at once.
        """
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

    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        """Recipients with position > ``after``, in position order."""
        ...


class Tasks(Protocol):
    """The tasks of every campaign, and their state machine.

    Contract:

    - Every task state change is a compare-and-set on the current state. It returns the updated
      task, or None when the task was not in ``expected`` (someone else changed it first). The
      change is appended to the change log in the same transaction, so a reader of the log never
      misses a change and never sees one that did not happen.
    - Only transitions in :data:`sendqueue.domain.lifecycle.TASK_TRANSITIONS` are attempted;
      the store raises :class:`~sendqueue.domain.errors.IllegalTransition` for any other.
    - ``insert_tasks`` is idempotent: a task whose id exists is left untouched and not counted,
      and so is one whose campaign, position and ``step`` another task holds (a recipient has
      one task per step). A step outside 1 to 10 is InvalidField ``step``, nothing inserted.
      Each inserted task gets a change-log entry ``None -> Pending``. It also takes tasks that
      are Cancelled with a ``reason`` (a suppressed recipient's), logged ``None -> Cancelled``
      with the reason as the note.
    """

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
        as read. PostgreSQL and SQLite: one round trip; DynamoDB: four reads (the task, its
        campaign's state, its address's entry, its booking) and one transaction."""
        ...

    def finish_send(
        self,
        task_id: str,
        *,
        at: datetime,
        message_id: str,
        slot: datetime | None = None,
        follow_up: bool = False,
    ) -> SendFinish:
        """The send worker's finish, one statement or transaction: Running -> Finished with
        ``sent_at = outcome_at = at``, the message id, outcome accepted and no error, logged;
        with ``slot`` (the claimed task's send_at), the task's booking at that instant is
        counted sent in the same write (``SenderStore.mark_sent``). With ``follow_up``, the
        task is marked as having its sequence's next step to make (:class:`~sendqueue.ports.
        sequences.FollowUpMarks`) in the same write. Also tells whether the campaign has other
        Pending tasks. DynamoDB runs these as consecutive writes."""
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
        step: int | None = None,
    ) -> list[Task]:
        """A page of the campaign's tasks with position > ``after``, in position order.

        ``search`` matches a case-insensitive substring of the address; ``step`` keeps that
        step's tasks only (InvalidField ``step`` outside 1 to 10). The cursor is a position:
        in a campaign with later steps, a page may end between one position's steps, so walk
        such a campaign one ``step`` at a time.
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

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        """Whether any task of the campaign is Pending or Running, or marked as having its
        next step to make (``finish_send(follow_up=True)``); False for an unknown one."""
        ...

    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]:
        """Number of tasks per state; every state is present, zero included."""
        ...

    def count_steps(self, campaign_id: str) -> dict[int, StepCounts]:
        """Per step number, the step's tasks per state and its sent emails per outcome; only
        steps that have tasks are present. Empty for an unknown campaign."""
        ...

    def count_moves(self, campaign_id: str, *, late_after: float) -> tuple[int, int]:
        """``(moved, late)``: how many of the campaign's tasks were moved at least once, and
        how many Finished ones went out more than ``late_after`` seconds after their send
        time. (0, 0) for an unknown campaign.
        """
        ...


class ChangeLog(Protocol):
    """Every change of a task or a campaign, in commit order.

    Contract: change-log ids are strictly increasing; ``changes_after(n)`` returns entries with
    id > n in id order.
    """

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


class Leases(Protocol):
    """Named leases: one holder at a time across processes (a reconciler pass, a campaign's
    provisioning or re-plan, a feedback poll, the alarm's email)."""

    def acquire_lease(self, name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        """Take or renew the named lease if it is free, expired or already ours."""
        ...

    def release_lease(self, name: str, owner: str) -> None: ...


class Counters(Protocol):
    """Named integers shared by every process on the store.

    Contract: ``counter(name)`` is 0 until ``increment_counter(name)`` first runs; an increment
    is atomic (two processes that increment at once both count) and returns the new value, read
    back in the same write. Counters only go up. The web app keeps its session generation in
    one (logout bumps it).
    """

    def counter(self, name: str) -> int:
        """The counter's value, read consistently; 0 for one never incremented."""
        ...

    def increment_counter(self, name: str) -> int:
        """Add one to the counter atomically (creating it at 1); returns the new value."""
        ...


class CampaignTasks(Campaigns, Tasks, Protocol):
    """Campaigns with their tasks, from one store: what a service that reads a campaign and
    changes its tasks (the send worker, the controls, the feedback loop) is handed."""


class LeasedCampaignTasks(CampaignTasks, Leases, Protocol):
    """Campaigns with their tasks, and the leases that keep one process at a time on a
    campaign (provisioning, re-planning, the reconciler)."""


class TaskStore(Campaigns, Tasks, ChangeLog, Leases, Counters, Protocol):
    """Durable campaigns, recipients and tasks, the change log, leases and counters: the
    source of truth, every aggregate of it in one database (see each port's contract).

    Every backend's task store keeps the suppression list, the feedback loop's state, the
    senders and their bookings and the webhooks too, in the same database:
    :class:`~sendqueue.ports.stores.StoreBackend` says so, and
    :class:`~sendqueue.ports.stores.Stores` hands each out as its own port.
    """

    def close(self) -> None: ...
