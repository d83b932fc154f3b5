"""An in-memory :class:`~sendqueue.ports.FeedbackSource`: a mailbox whose messages the test
adds, with a UIDVALIDITY it can change and an outage it can switch on."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from sendqueue.domain.errors import FeedbackUnavailable
from sendqueue.ports import FeedbackMessage

__all__ = ["InMemoryMailbox"]

_ENDED = "another fetch or close() came first"


class InMemoryMailbox:
    """A feedback mailbox in memory, with the IMAP source's contract: UIDs ascend from 1 within
    a UIDVALIDITY, ``fetch`` returns those above the cursor (all of them for another
    UIDVALIDITY), at most ``limit``, one at a time, and changes nothing. Its iterator ends at
    the next ``fetch`` or ``close``, and raises while the mailbox is down (``available``
    False), as the IMAP one does when its connection fails half-way. ``fetches`` counts the
    calls, ``handed`` the messages the iterators gave."""

    def __init__(self, name: str = "imap://bounces@mail.test:143/INBOX") -> None:
        self.name = name
        self.uidvalidity = 1
        self.available = True
        self.fetches = 0
        self.closed = 0
        self.handed = 0
        self._generation = 0
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
    ) -> tuple[int, Iterator[FeedbackMessage]]:
        with self._lock:
            self.fetches += 1
            self._generation += 1
            if not self.available:
                raise FeedbackUnavailable(f"{self.name}: connecting failed: simulated outage")
            first = after[1] + 1 if after is not None and after[0] == self.uidvalidity else 1
            chosen = [m for m in self._messages if m.uid >= first][:limit]
            return self.uidvalidity, self._handing(self._generation, chosen)

    def close(self) -> None:
        with self._lock:
            self.closed += 1
            self._generation += 1

    def _handing(self, generation: int, chosen: list[FeedbackMessage]) -> Iterator[FeedbackMessage]:
        chosen.reverse()  # popped from the end: the first UID first
        while chosen:
            with self._lock:
                if generation != self._generation:
                    raise FeedbackUnavailable(f"{self.name}: fetching failed: {_ENDED}")
                if not self.available:
                    raise FeedbackUnavailable(f"{self.name}: fetching failed: simulated outage")
                self.handed += 1
            yield chosen.pop()
