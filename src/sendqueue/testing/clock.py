"""A fake clock that tests move by hand (the real one is :mod:`sendqueue.adapters.clock`)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from sendqueue.adapters.clock import SystemClock

__all__ = ["FakeClock", "SystemClock"]


class FakeClock:
    """A clock that only moves when told to. Thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs an aware start time")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Move forward by ``seconds`` (and/or ``timedelta`` keywords); returns the new time."""
        with self._lock:
            self._now += timedelta(seconds=seconds, **delta)
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when
