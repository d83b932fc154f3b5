"""An Alarm that remembers what it was raised for, for tests."""

from __future__ import annotations

import threading

from sendqueue.domain.alarms import AutoPause
from sendqueue.domain.models import DeadLetter

__all__ = ["RecordingAlarm"]


class RecordingAlarm:
    """Records every dead letter and auto-pause it is raised for, in order. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._letters: list[DeadLetter] = []
        self._pauses: list[AutoPause] = []

    def raise_alarm(self, letter: DeadLetter) -> None:
        with self._lock:
            self._letters.append(letter)

    def auto_paused(self, pause: AutoPause) -> None:
        with self._lock:
            self._pauses.append(pause)

    @property
    def letters(self) -> list[DeadLetter]:
        """A copy of the letters raised so far."""
        with self._lock:
            return list(self._letters)

    @property
    def pauses(self) -> list[AutoPause]:
        """A copy of the auto-pauses raised so far."""
        with self._lock:
            return list(self._pauses)
