"""An Alarm that remembers what it was raised for, for tests."""

from __future__ import annotations

import threading

from sendqueue.domain.models import DeadLetter

__all__ = ["RecordingAlarm"]


class RecordingAlarm:
    """Records every dead letter it is raised for, in order. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._letters: list[DeadLetter] = []

    def raise_alarm(self, letter: DeadLetter) -> None:
        with self._lock:
            self._letters.append(letter)

    @property
    def letters(self) -> list[DeadLetter]:
        """A copy of the letters raised so far."""
        with self._lock:
            return list(self._letters)
