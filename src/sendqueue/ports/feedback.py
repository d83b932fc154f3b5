"""The feedback loop's ports: what a store keeps for it (:class:`FeedbackStore`: the tasks'
:class:`FeedbackOutcomes` and the mailboxes' :class:`FeedbackCursors`) and the
mailboxes feedback arrives in (:class:`FeedbackSource`, :class:`FeedbackMessage`). Every name is
importable from :mod:`sendqueue.ports` too."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Protocol

from sendqueue.domain.feedback import MailboxState
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task

__all__ = [
    "FeedbackCursors",
    "FeedbackMessage",
    "FeedbackOutcomes",
    "FeedbackSource",
    "FeedbackStore",
]


class FeedbackOutcomes(Protocol):
    """What the feedback loop keeps of tasks: their outcomes, the tasks of an address, and an
    address's transient bounces. Every task store implements it, in the same database.

    Contract:

    - ``set_outcome`` records an outcome on a Finished task, with its detail and time, and logs
      it in the same transaction as a change-log entry whose ``from_state`` and ``to_state`` are
      both "Finished" and whose note is :func:`sendqueue.domain.feedback.outcome_note`. It
      returns the updated task, or None (nothing written, nothing logged) when the task is
      unknown, not Finished, or already has that outcome. ``accepted`` never replaces another
      outcome (the worker writes it with the Finished transition, through ``TaskChanges``).
    - ``note_unverified_reply`` writes ``detail`` as the outcome detail of a Finished task
      whose outcome is ``accepted`` (the outcome stays), logged like ``set_outcome`` with the
      note ``"outcome: accepted (unverified reply)"``. It returns the updated task, or None
      (nothing written, nothing logged) when the task is unknown, not Finished, has another
      outcome, or already has a detail (the first note is kept: anyone can send one).
    - ``tasks_for`` returns the tasks whose address's compared form
      (:func:`sendqueue.domain.suppression.key_of_normalized` of ``Task.email``) is ``email``
      and whose state is one of ``states``, across every campaign, newest ``send_at`` first, at
      most ``limit``: an indexed read, never a scan of all tasks.
    - ``record_soft_bounce`` keeps one transient bounce of an address under ``key`` (the
      message it came from): the same key twice is kept once. It returns how many of the
      address's kept bounces are at or after ``since``.
    - ``count_outcomes`` counts a campaign's tasks per outcome (outcomes with no task left out;
      {} for an unknown campaign).
    - ``set_away`` keeps the return date an out-of-office notice of a campaign's recipient
      (by position) named, noticed ``at``: one date per recipient and campaign, a later
      notice's replacing an earlier one's (a notice older than the one kept changes nothing,
      so notices applied out of order keep the newest). ``away_until`` reads it (None: no
      notice). Kept whatever the campaign's tasks do; the follow-up maker reads it.
    - An unreachable backend raises :class:`~sendqueue.domain.errors.StoreUnavailable`.
    """

    def set_outcome(
        self, task_id: str, outcome: TaskOutcome, *, detail: str | None, at: datetime
    ) -> Task | None:
        """Record ``outcome`` on a Finished task; None when nothing changed."""
        ...

    def note_unverified_reply(self, task_id: str, *, detail: str, at: datetime) -> Task | None:
        """Note a reply that proved nothing on an ``accepted`` task; None when nothing changed."""
        ...

    def tasks_for(
        self, email: str, *, states: Collection[TaskState], limit: int = 1000
    ) -> list[Task]:
        """The address's tasks in ``states``, newest ``send_at`` first."""
        ...

    def record_soft_bounce(self, email: str, key: str, *, at: datetime, since: datetime) -> int:
        """Keep the bounce ``key`` of ``email``; how many are kept at or after ``since``."""
        ...

    def count_outcomes(self, campaign_id: str) -> dict[TaskOutcome, int]:
        """The campaign's tasks per outcome."""
        ...

    def set_away(self, campaign_id: str, position: int, until: date, *, at: datetime) -> None:
        """Keep the recipient's return date (the newest notice's)."""
        ...

    def away_until(self, campaign_id: str, position: int) -> date | None:
        """The recipient's return date, or None."""
        ...

    def away_dates(self, campaign_id: str, positions: Collection[int]) -> dict[int, date]:
        """The return dates kept for those of ``positions`` that have one."""
        ...


class FeedbackCursors(Protocol):
    """Each feedback mailbox's position and what its passes saw. Every task store implements
    it, in the same database.

    Contract:

    - ``feedback_cursor`` is the position saved for a mailbox: its UIDVALIDITY and the highest
      UID processed, or None. ``save_feedback_cursor`` only moves forward within one
      UIDVALIDITY (a lower UID is ignored); another UIDVALIDITY replaces the position.
    - ``record_mailbox_pass`` keeps what one pass over a mailbox saw: ``polled_at`` becomes
      ``at``, ``messages`` is added to ``messages_read`` (cumulative), and ``last_error``
      becomes ``error`` (None clears it). It never moves the mailbox's position, and a mailbox
      with a pass but no position yet (its first pass failed) has no cursor (None).
      ``mailbox_states`` reads back the states of the named mailboxes that have one, by name.
    - An unreachable backend raises :class:`~sendqueue.domain.errors.StoreUnavailable`.
    """

    def feedback_cursor(self, mailbox: str) -> tuple[int, int] | None:
        """``(uidvalidity, highest uid processed)`` of ``mailbox``, or None."""
        ...

    def save_feedback_cursor(self, mailbox: str, uidvalidity: int, uid: int) -> None:
        """Move the mailbox's position forward (see the contract)."""
        ...

    def record_mailbox_pass(
        self, mailbox: str, *, at: datetime, messages: int, error: str | None
    ) -> None:
        """Keep one pass's time, messages read and error (see the contract)."""
        ...

    def mailbox_states(self, mailboxes: Collection[str]) -> dict[str, MailboxState]:
        """The kept state of each of ``mailboxes`` that has one."""
        ...


class FeedbackStore(FeedbackOutcomes, FeedbackCursors, Protocol):
    """What the feedback loop keeps: :class:`FeedbackOutcomes` and :class:`FeedbackCursors`
    together. Every task store implements it, in the same database."""


@dataclass(frozen=True)
class FeedbackMessage:
    """One message of a feedback mailbox: where it is (``mailbox`` names the mailbox without
    credentials, e.g. ``imap://bounces@mail.example.com:993/INBOX``), and its raw bytes."""

    mailbox: str
    uidvalidity: int
    uid: int
    raw: bytes

    @property
    def key(self) -> str:
        """The message's identity across restarts: ``mailbox:uidvalidity:uid``."""
        return f"{self.mailbox}:{self.uidvalidity}:{self.uid}"


class FeedbackSource(Protocol):
    """A mailbox that feedback arrives in (bounces, complaints, replies).

    Contract: ``fetch(after)`` returns the mailbox's UIDVALIDITY and an iterator over its
    messages with a UID above ``after``'s (all of them when ``after`` is None or names another
    UIDVALIDITY), in UID order, at most ``limit``. The iterator reads as it goes, holding a few
    messages' bytes, never the batch; the source's next ``fetch`` or ``close`` ends it (going on
    raises) and it may be dropped half-way. The mailbox is never changed: no flag set, nothing
    moved or deleted. ``name`` is its identity for the cursor (no credentials). A mailbox that
    cannot be reached, logged in to or read raises
    :class:`~sendqueue.domain.errors.FeedbackUnavailable`, from ``fetch`` or the iterator.
    """

    name: str

    def fetch(
        self, after: tuple[int, int] | None, *, limit: int = 500
    ) -> tuple[int, Iterator[FeedbackMessage]]: ...

    def close(self) -> None: ...
