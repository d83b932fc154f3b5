"""A fake :class:`~sendqueue.ports.Mailer` that records what it was asked to send."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from sendqueue.ports import OutgoingMessage

__all__ = ["RecordingMailer"]

SendHook = Callable[[OutgoingMessage], None]


class RecordingMailer:
    """Records every accepted message; outcomes can be programmed. Thread-safe.

    - ``sent`` holds the accepted messages, in acceptance order; ``attempts`` every call to
      ``send``, refused ones included.
    - ``fail_next(*errors)`` queues exceptions: each following ``send`` raises the next one
      (and records nothing) until the queue is empty, then sends succeed again.
    - ``on_send(message)`` runs at the start of every ``send``, before the outcome; whatever it
      raises propagates, so a test can fail a send for one recipient only, or block it on an
      Event to pause a worker mid-send.
    - ``after_send(message)`` runs after a message was accepted and recorded, before ``send``
      returns: the moment "the provider has it, the caller does not know yet".
    """

    def __init__(
        self, *, on_send: SendHook | None = None, after_send: SendHook | None = None
    ) -> None:
        self.on_send = on_send
        self.after_send = after_send
        self.closed = 0
        self._sent: list[OutgoingMessage] = []
        self._attempts: list[OutgoingMessage] = []
        self._failures: deque[BaseException] = deque()
        self._cond = threading.Condition()

    @property
    def sent(self) -> list[OutgoingMessage]:
        """A copy of the accepted messages."""
        with self._cond:
            return list(self._sent)

    @property
    def attempts(self) -> list[OutgoingMessage]:
        """A copy of every message passed to ``send``, accepted or not."""
        with self._cond:
            return list(self._attempts)

    def sent_to(self, address: str) -> list[OutgoingMessage]:
        """The accepted messages for ``address`` (case-insensitive)."""
        wanted = address.lower()
        return [m for m in self.sent if m.to_addr.lower() == wanted]

    def fail_next(self, *errors: BaseException) -> None:
        """Make the next ``len(errors)`` sends raise these exceptions, in order."""
        with self._cond:
            self._failures.extend(errors)

    def clear(self) -> None:
        """Forget recorded messages and queued failures."""
        with self._cond:
            self._sent.clear()
            self._attempts.clear()
            self._failures.clear()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[OutgoingMessage]:
        """Block until at least ``count`` messages were accepted; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._sent) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self._sent)} of {count} messages accepted within {timeout}s"
                    )
                self._cond.wait(left)
            return list(self._sent)

    def send(self, message: OutgoingMessage) -> str:
        with self._cond:
            self._attempts.append(message)
        if self.on_send is not None:
            self.on_send(message)
        with self._cond:
            error = self._failures.popleft() if self._failures else None
            if error is None:
                self._sent.append(message)
                self._cond.notify_all()
        if error is not None:
            raise error
        if self.after_send is not None:
            self.after_send(message)
        return message.message_id

    def close(self) -> None:
        """Counts the calls in ``closed``; the mailer stays usable, as the real ones do."""
        with self._cond:
            self.closed += 1
