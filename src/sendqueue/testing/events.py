"""An Events port that remembers what it heard, for tests."""

from __future__ import annotations

import threading
from collections import Counter

from sendqueue.domain.alarms import AlarmItem
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import SendOutcome

__all__ = ["RecordingEvents"]


class RecordingEvents:
    """Records every event, in order. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sends: list[tuple[SendOutcome, float | None]] = []
        self._dead_letters: list[DeadLetter] = []
        self._alarms: list[AlarmItem] = []
        self._repairs: Counter[str] = Counter()

    def send_finished(self, outcome: SendOutcome, lateness: float | None = None) -> None:
        with self._lock:
            self._sends.append((outcome, lateness))

    def dead_lettered(self, letter: DeadLetter) -> None:
        with self._lock:
            self._dead_letters.append(letter)

    def alarm_raised(self, item: AlarmItem) -> None:
        with self._lock:
            self._alarms.append(item)

    def repaired(self, kind: str, n: int) -> None:
        with self._lock:
            self._repairs[kind] += n

    @property
    def sends(self) -> list[tuple[SendOutcome, float | None]]:
        """``(outcome, lateness)`` of every send invocation so far."""
        with self._lock:
            return list(self._sends)

    @property
    def outcomes(self) -> list[SendOutcome]:
        """Only the outcomes of :attr:`sends`."""
        return [outcome for outcome, _ in self.sends]

    @property
    def dead_letters(self) -> list[DeadLetter]:
        with self._lock:
            return list(self._dead_letters)

    @property
    def alarms(self) -> list[AlarmItem]:
        with self._lock:
            return list(self._alarms)

    @property
    def repairs(self) -> dict[str, int]:
        """Repairs by kind (only kinds that were repaired)."""
        with self._lock:
            return {kind: n for kind, n in self._repairs.items() if n}
