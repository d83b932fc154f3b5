"""Scheduler and store wrappers that inject faults, for provisioning and reconciler tests."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sendqueue.domain.errors import SchedulerError, Throttled
from sendqueue.ports import Schedule, Scheduler

__all__ = ["CrashAfter", "FlakyScheduler", "Meanwhile", "StoreCrash"]


class FlakyScheduler:
    """Wraps a Scheduler: fails a share of ``create`` calls and throttles others, and counts
    how many calls are in flight at once (``max_in_flight``)."""

    def __init__(
        self, inner: Scheduler, *, fail: float = 0.0, throttle: float = 0.0, seed: int = 7
    ) -> None:
        self.inner = inner
        self.fail = fail
        self.throttle = throttle
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.failures = 0
        self.throttles = 0

    def create(
        self,
        name: str,
        group: str,
        at_local: datetime,
        timezone: str,
        payload: Mapping[str, str],
        client_token: str,
        max_retries: int = 2,
    ) -> Schedule:
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            roll = self._rng.random()
        try:
            if roll < self.fail:
                with self._lock:
                    self.failures += 1
                raise SchedulerError("injected: scheduler unavailable")
            if roll < self.fail + self.throttle:
                with self._lock:
                    self.throttles += 1
                raise Throttled("injected: rate exceeded")
            # a tiny pause so concurrent calls overlap and the in-flight bound is observable
            threading.Event().wait(0.001)
            return self.inner.create(
                name, group, at_local, timezone, payload, client_token, max_retries
            )
        finally:
            with self._lock:
                self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class StoreCrash(Exception):
    """A simulated process death in the middle of provisioning."""


class CrashAfter:
    """Wraps any object: the ``n``-th call of ``method`` raises StoreCrash (then passes)."""

    def __init__(self, inner: Any, method: str, n: int) -> None:
        self.inner = inner
        self.method = method
        self.remaining = n

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.remaining -= 1
            if self.remaining == 0:
                raise StoreCrash(f"crash at call of {name}")
            return attr(*args, **kwargs)

        return wrapped


class Meanwhile:
    """Wraps any object (a store): once :meth:`arm` ed for a method, the next call of it reads
    what it reads, then runs ``action`` before its caller gets the answer. That is another
    process acting between a reader's read and what the reader does with it, played
    deterministically (a worker sending a task the reconciler just listed as Pending)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._armed: dict[str, Callable[[], object]] = {}

    def arm(self, method: str, action: Callable[[], object]) -> None:
        self._armed[method] = action

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self._armed:
            return attr

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            action = self._armed.pop(name, None)  # once; and not again from within the action
            if action is not None:
                action()
            return result

        return wrapped
