"""Named task transitions: each state change a service makes, as one pure function.

Each function takes the task (as the caller read it) and what the change needs, and returns a
:class:`TaskChange`: the state it expects, the state it sets, the fields it sets with it and the
change-log note. The store applies it as its compare-and-set on the expected state
(``TaskStore.transition``); nothing here does I/O. A change is checked against
:data:`~sendqueue.domain.lifecycle.TASK_TRANSITIONS` when it is made, so an illegal one is
never built.

A move to another slot keeps the task Pending (not a lifecycle transition): :func:`move` gives
the :class:`~sendqueue.domain.models.Move` that ``TaskStore.reschedule`` applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from .errors import IllegalTransition
from .lifecycle import TaskOutcome, TaskState, check_task_transition
from .models import Move, Task, TaskChanges, new_token

__all__ = [
    "ERROR_LIMIT",
    "MOVED_REASON_LIMIT",
    "Rerender",
    "TaskChange",
    "cancel",
    "claim",
    "fail",
    "finish",
    "give_back",
    "move",
    "rerender",
    "retry_into",
    "unclaim",
]

#: The longest error text kept on a task (characters); longer ones are cut.
ERROR_LIMIT = 2000
#: The longest ``moved_reason`` kept on a task (characters).
MOVED_REASON_LIMIT = 300


@dataclass(frozen=True)
class TaskChange:
    """One task's state change, as the store applies it: ``expected -> new`` (compare-and-set
    on ``expected``), setting ``changes`` too and logging ``note``. Nobody mutates
    ``changes`` once made (a dict, as every store takes it)."""

    task_id: str
    expected: TaskState
    new: TaskState
    changes: TaskChanges = field(default_factory=TaskChanges, hash=False)
    note: str | None = None

    def __post_init__(self) -> None:
        check_task_transition(self.expected, self.new)


def claim(task: Task, now: datetime) -> TaskChange:
    """Pending -> Running: the claim that makes one invocation the one that sends; the attempt
    counts from here."""
    changes = TaskChanges(claimed_at=now, attempts=task.attempts + 1)
    return TaskChange(task.id, TaskState.PENDING, TaskState.RUNNING, changes)


def finish(task: Task, sent_at: datetime, message_id: str | None) -> TaskChange:
    """Running -> Finished: the provider accepted the email. The outcome starts as "accepted";
    feedback (a bounce, a reply) may change it later."""
    changes = TaskChanges(
        sent_at=sent_at,
        message_id=message_id,
        error=None,
        outcome=TaskOutcome.ACCEPTED,
        outcome_at=sent_at,
    )
    return TaskChange(task.id, TaskState.RUNNING, TaskState.FINISHED, changes)


def fail(task: Task, error: str, *, note: str | None = None) -> TaskChange:
    """Running -> Failed with ``error`` (cut to :data:`ERROR_LIMIT`); the note (the
    email.failed event's reason) is the error unless ``note`` says otherwise."""
    error = error[:ERROR_LIMIT]
    changes = TaskChanges(error=error)
    return TaskChange(
        task.id, TaskState.RUNNING, TaskState.FAILED, changes, error if note is None else note
    )


def give_back(task: Task, note: str, *, undo_attempt: bool = False) -> TaskChange:
    """Running -> Pending, not sent: its schedule or a re-plan sends it later. The claim's
    claimed_at goes (a Pending task holds no claim); with ``undo_attempt`` its attempt is not
    counted either (``task`` as claimed)."""
    changes = TaskChanges(claimed_at=None)
    if undo_attempt:
        changes["attempts"] = task.attempts - 1
    return TaskChange(task.id, TaskState.RUNNING, TaskState.PENDING, changes, note)


def unclaim(task: Task, note: str) -> TaskChange:
    """Running -> Pending as ``task`` was read before its claim (its attempts restored, no
    claimed_at): the claim is undone, as if it never happened."""
    changes = TaskChanges(attempts=task.attempts, claimed_at=None)
    return TaskChange(task.id, TaskState.RUNNING, TaskState.PENDING, changes, note)


def cancel(task: Task, *, reason: str | None = None, note: str | None = None) -> TaskChange:
    """Pending -> Cancelled. ``reason`` is kept on the task (e.g. "suppressed: bounced");
    the note is ``note``, else the reason."""
    changes = TaskChanges(reason=reason) if reason is not None else TaskChanges()
    return TaskChange(
        task.id, TaskState.PENDING, TaskState.CANCELLED, changes, reason if note is None else note
    )


def retry_into(
    task: Task,
    slot: datetime,
    *,
    reason: str,
    note: str,
    error: str | None = None,
    token: str | None = None,
) -> TaskChange:
    """Back to Pending in the free ``slot``, under a new token (``token``, or a fresh one),
    counted as a move for ``reason`` (cut to :data:`MOVED_REASON_LIMIT`), with ``error`` (cut
    to :data:`ERROR_LIMIT`).

    Either way the claim's claimed_at goes (a Pending task holds no claim). From Running (a
    transient error, a stale claim) the attempts stay counted; from Failed (retry-failed) the
    task starts afresh: no attempt. From any other state, IllegalTransition.
    """
    changes = TaskChanges(
        send_at=slot,
        token=new_token() if token is None else token,
        error=None if error is None else error[:ERROR_LIMIT],
        moves=task.moves + 1,
        moved_reason=reason[:MOVED_REASON_LIMIT],
        claimed_at=None,
    )
    if task.state is TaskState.FAILED:
        changes["attempts"] = 0
    elif task.state is not TaskState.RUNNING:
        raise IllegalTransition(
            "task",
            task.state.value,
            TaskState.PENDING.value,
            "only a Running or Failed task is retried",
        )
    return TaskChange(task.id, task.state, TaskState.PENDING, changes, note)


def move(task: Task, slot: datetime, *, token: str | None = None) -> Move:
    """The Pending ``task`` to ``slot`` under a new token (``token``, or a fresh one): applied
    by ``TaskStore.reschedule`` only while the task is Pending and still holds its token."""
    return Move(task.id, task.token, slot, new_token() if token is None else token)


class Rerender(NamedTuple):
    """A Pending task's email rendered anew (its step was edited): applied by
    ``SequenceEdits.rerender`` only while the task is Pending and still holds ``token``; only
    its subject, text and html change (its token stays, so its schedule still claims it)."""

    task_id: str
    campaign_id: str
    token: str
    subject: str
    text: str
    html: str | None


def rerender(task: Task, subject: str, text: str, html: str | None) -> Rerender:
    """The Pending ``task`` with a new subject, text and html. An email already claimed or
    ended keeps the text it was sent with (IllegalTransition): only a Pending one changes."""
    if task.state is not TaskState.PENDING:
        raise IllegalTransition(
            "task", task.state.value, TaskState.PENDING.value, "only a Pending email is re-rendered"
        )
    return Rerender(task.id, task.campaign_id, task.token, subject, text, html)
