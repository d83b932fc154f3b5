"""An in-memory :class:`~sendqueue.ports.FeedbackSource`: a mailbox whose messages the test
adds, with a UIDVALIDITY it can change and an outage it can switch on."""

from __future__ import annotations

import threading

from sendqueue.domain.errors import FeedbackUnavailable
from sendqueue.ports import FeedbackMessage

__all__ = ["InMemoryMailbox"]


class InMemoryMailbox:
    """A feedback mailbox in memory, with the IMAP source's contract: UIDs ascend from 1 within
    a UIDVALIDITY, ``fetch`` returns those above the cursor (all of them for another
    UIDVALIDITY), at most ``limit``, and changes nothing. ``fetches`` counts the calls."""

    def __init__(self, name: str = "imap://bounces@mail.test:143/INBOX") -> None:
        self.name = name
        self.uidvalidity = 1
        self.available = True
        self.fetches = 0
        self.closed = 0
        self._messages: list[FeedbackMessage] = []
        self._lock = threading.Lock()

    def add(self, raw: bytes) -> int:
        """Deliver ``raw``; its UID."""
        with self._lock:
            uid = self._messages[-1].uid + 1 if self._messages else 1
            self._messages.append(FeedbackMessage(self.name, self.uidvalidity, uid, raw))
            return uid

    def recreate(self) -> None:
        """The mailbox was re-created: a new UIDVALIDITY, the same messages numbered anew."""
        with self._lock:
            self.uidvalidity += 1
            self._messages = [
                FeedbackMessage(self.name, self.uidvalidity, i, m.raw)
                for i, m in enumerate(self._messages, 1)
            ]

    def fetch(
        self, after: tuple[int, int] | None, *, limit: int = 500
    ) -> tuple[int, list[FeedbackMessage]]:
        with self._lock:
            self.fetches += 1
            if not self.available:
                raise FeedbackUnavailable(f"{self.name}: connecting failed: simulated outage")
            first = after[1] + 1 if after is not None and after[0] == self.uidvalidity else 1
            return self.uidvalidity, [m for m in self._messages if m.uid >= first][:limit]

    def close(self) -> None:
        self.closed += 1
