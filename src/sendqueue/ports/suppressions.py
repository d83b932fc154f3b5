"""The :class:`SuppressionList` port, and :class:`ReadsTaskThenSuppression`, its
``task_and_suppression`` for stores that read twice. Every name is importable from
:mod:`sendqueue.ports` too."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from sendqueue.domain.models import Task
from sendqueue.domain.suppression import Suppression, key_of_normalized

__all__ = ["ReadsTaskThenSuppression", "SuppressionList"]


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
