"""The execution layer's ports (see :mod:`sendqueue.ports`): :class:`Scheduler`, one one-time
schedule per task, shaped like EventBridge Scheduler, with retries and a dead-letter queue;
:class:`BulkScheduler`, the ability to write many at once; :class:`BackgroundBulkScheduler`, the
ability to write them on a thread of the layer's own; and :class:`Dispatcher`, which runs a
layer's due schedules in this process. :mod:`sendqueue.ports` re-exports every name here.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from sendqueue.domain.models import DeadLetter

__all__ = [
    "BackgroundBulkScheduler",
    "BulkScheduler",
    "CreateArgs",
    "Dispatcher",
    "DueArgs",
    "Schedule",
    "Scheduler",
    "Target",
]


@dataclass(frozen=True)
class Schedule:
    """A one-time schedule in the execution layer (EventBridge Scheduler's shape).

    ``at_local`` is naive wall-clock time in ``timezone``; ``due_at`` is the same instant in UTC.
    """

    name: str
    group: str
    at_local: datetime
    timezone: str
    payload: Mapping[str, str]
    client_token: str
    due_at: datetime
    max_retries: int = 2
    attempts: int = 0
    created_at: datetime | None = None


#: The function a schedule invokes with its payload. It returns normally when the invocation
#: succeeded (the schedule then deletes itself) and raises when it failed (retry, then DLQ).
Target = Callable[[Mapping[str, str]], None]


class Scheduler(Protocol):
    """The execution layer: one-time schedules, retries, a dead-letter queue.

    Contract (EventBridge Scheduler's rules, so every adapter accepts what the strictest does):

    - Names are 1..64 chars of ``[0-9a-zA-Z-_.]``; groups likewise; client tokens 1..64 of
      ``[a-zA-Z0-9-_]``. Anything else raises InvalidField naming the field.
    - ``create`` with a new name creates the schedule. With an existing name and the same token
      it is a no-op that returns the existing schedule; with another token it raises Conflict.
    - ``delete`` of a missing name succeeds. ``get`` of a missing name returns None.
    - ``list(group)`` pages by name (``after``), in name order.
    - A schedule fires at ``due_at`` or later (overdue ones as soon as possible, in due order),
      to the layer's ``firing_precision`` (seconds; 0.0 is exact: the embedded and procrastinate
      layers). A coarser layer's schedule may fire anywhere from the start of the
      ``firing_precision``-long slot holding ``due_at`` (whole slots counted from the Unix
      epoch; EventBridge Scheduler: 60, any time within the minute of its ``at()`` time). The
      composition root hands it to the send worker, which must not skip such an invocation as
      early.
    - After an invocation that returns, the schedule is deleted. One that raises is retried
      ``max_retries`` times with backoff, then removed and recorded as a dead letter, and the
      alarm is raised. Delivery is at-least-once: a target may run twice for one schedule.
    - ``dead_letters`` lists the letters oldest first, at most ``limit``; ``dead_letter`` reads
      one by id (None if there is none).
    - ``redrive`` turns a dead letter back into a schedule due now and removes the letter.
    - Backend failures raise SchedulerError; rate limits raise Throttled.
    """

    #: Seconds to which schedules fire (0.0: exact); see the contract above.
    firing_precision: float

    def create(
        self,
        name: str,
        group: str,
        at_local: datetime,
        timezone: str,
        payload: Mapping[str, str],
        client_token: str,
        max_retries: int = 2,
    ) -> Schedule: ...

    def delete(self, name: str) -> None: ...

    def get(self, name: str) -> Schedule | None: ...

    def list(
        self, group: str, *, after: str | None = None, limit: int = 1000
    ) -> list[Schedule]: ...

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]: ...

    def dead_letter(self, dead_letter_id: str) -> DeadLetter | None: ...

    def redrive(self, dead_letter_id: str) -> Schedule:
        """Re-create the dead letter's schedule, due now. NotFound if unknown."""
        ...

    def close(self) -> None: ...


#: ``create``'s positional arguments: name, group, at_local, timezone, payload, client_token,
#: max_retries.
CreateArgs = tuple[str, str, datetime, str, Mapping[str, str], str, int]

#: ``create_many``'s items: ``create``'s arguments with the instant the schedule is due (an
#: aware datetime; UTC is the one taken without a conversion) in place of ``at_local``: name,
#: group, due_at, timezone, payload, client_token, max_retries. The schedule made is the one
#: ``create`` makes from ``due_at`` read as wall-clock time in ``timezone``: it is due at
#: exactly ``due_at``, and its ``at_local`` is that wall time.
DueArgs = tuple[str, str, datetime, str, Mapping[str, str], str, int]


@runtime_checkable
class BulkScheduler(Protocol):
    """A scheduler that also writes many schedules in one call (one transaction: the embedded
    and procrastinate layers).

    Its items carry the instant each schedule is due (:data:`DueArgs`), which the caller has
    already (a task's ``send_at``), instead of a wall time the layer would check and read back
    into an instant per schedule. ``create_many`` returns one result per item, in order: None
    where the schedule now exists as asked (made by the call, or there already with the same
    token), or the Conflict (a name held with another token) that ``create`` would have raised
    for it; other errors raise for the whole batch. (No Schedule per item: a bulk write's
    caller needs only the clashes, and building a hundred thousand objects to drop them was a
    tenth of a provisioning run.)
    Check the class (``issubclass(type(s), BulkScheduler)``), not the instance, so a wrapper
    that forwards unknown attributes still sees each ``create`` itself.
    """

    def create_many(self, items: Sequence[DueArgs]) -> Sequence[Exception | None]: ...


@runtime_checkable
class BackgroundBulkScheduler(BulkScheduler, Protocol):
    """A bulk scheduler that can write a batch while its caller goes on (the embedded layer).

    ``submit_many(items)`` checks the items as ``create_many`` does, on the caller's thread
    (InvalidField is raised there, and nothing is written), starts their write and returns at
    once. Calling what it returns waits for the write and returns what ``create_many`` would
    have at some instant between the call and the wait's return (or raises its
    SchedulerError). Batches that share no name do not affect each other; a caller that submits
    batches sharing a name waits for one before it submits the next. Checked on the class, as
    :class:`BulkScheduler` is.
    """

    def submit_many(self, items: Sequence[DueArgs]) -> Callable[[], Sequence[Exception | None]]: ...


@runtime_checkable
class Dispatcher(Protocol):
    """Runs due schedules of an execution layer against ``target`` until ``stop`` is set.

    ``runs_reconciler`` is true when the execution layer runs the reconciler itself (a periodic
    job shared by all workers); the worker process then runs no reconciler loop of its own.
    """

    runs_reconciler: bool

    def run(self, target: Target, stop: threading.Event) -> None: ...
