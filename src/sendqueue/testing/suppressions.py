"""The in-memory :class:`~sendqueue.ports.SuppressionList`, a base of the in-memory task store
(it shares the store's lock and its simulated outages)."""

from __future__ import annotations

import threading
from bisect import bisect_right, insort
from collections.abc import Iterable, Sequence

from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, check_limit
from sendqueue.domain.suppression import SUPPRESSED_PREFIX, Suppression
from sendqueue.ports import ReadsTaskThenSuppression
from sendqueue.testing.guard import guarded

__all__ = ["InMemorySuppressions"]


class InMemorySuppressions(ReadsTaskThenSuppression):
    """:class:`~sendqueue.ports.SuppressionList` in memory: a dict and its sorted keys."""

    _lock: threading.RLock
    _available: bool
    _tasks: dict[str, Task]
    _task_at: dict[str, dict[tuple[int, int], str]]

    def __init__(self) -> None:
        self._suppressions: dict[str, Suppression] = {}
        self._suppressed_order: list[str] = []

    @guarded
    def suppress(self, entries: Sequence[Suppression]) -> int:
        added = 0
        for entry in entries:
            if entry.email not in self._suppressions:
                self._suppressions[entry.email] = entry
                insort(self._suppressed_order, entry.email)
                added += 1
        return added

    @guarded
    def unsuppress(self, email: str) -> bool:
        if self._suppressions.pop(email, None) is None:
            return False
        self._suppressed_order.remove(email)
        return True

    @guarded
    def suppressed(self, emails: Iterable[str]) -> dict[str, Suppression]:
        return {e: self._suppressions[e] for e in emails if e in self._suppressions}

    @guarded
    def list_suppressions(self, *, after: str | None = None, limit: int = 100) -> list[Suppression]:
        check_limit(limit)
        start = 0 if after is None else bisect_right(self._suppressed_order, after)
        return [self._suppressions[e] for e in self._suppressed_order[start : start + limit]]

    @guarded
    def count_suppressions(self) -> int:
        return len(self._suppressions)

    @guarded
    def count_suppressed_tasks(self, campaign_id: str) -> int:
        return sum(
            1
            for task_id in self._task_at.get(campaign_id, {}).values()
            if (task := self._tasks[task_id]).state is TaskState.CANCELLED
            and (task.reason or "").startswith(SUPPRESSED_PREFIX)
        )
