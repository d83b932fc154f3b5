"""Whether the live stream's change-log reader keeps up with the store.

A heartbeat only says that a connection is open; it says nothing of whether the one reader of a
process (:class:`sendqueue.web.stream.ChangeBroker`) still brings the store's changes. So the
reader keeps a :class:`ReaderHealth` and every client gets ``status`` frames: ``delayed`` when,
for longer than the threshold (``SENDQUEUE_STREAM_LAG_THRESHOLD``, 5 s),

- no read of the change log has finished: the store fails (``failing``) or a read hangs
  (``stalled``); or
- the store holds a change the reader has not delivered (``behind``): its newest change id,
  read beside the log, is past the reader's position, and the oldest entry that was seen
  undelivered has stayed so.

Then ``live`` again once reads succeed and the reader has caught up. Times are the caller's
monotonic seconds, so the rules are tested without sleeping.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

__all__ = ["LIVE", "ReaderHealth", "StreamStatus"]


@dataclass(frozen=True)
class StreamStatus:
    """What a ``status`` frame says."""

    state: Literal["live", "delayed"]
    cause: Literal["", "failing", "stalled", "behind"] = ""
    reason: str = ""
    lag_seconds: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        """What a client is told again when it changes (not the growing lag)."""
        return (self.state, self.cause)

    def frame(self) -> str:
        """The SSE frame: ``event: status`` and the JSON on one line (no ``id``)."""
        data = {
            "state": self.state,
            "cause": self.cause or None,
            "reason": self.reason or None,
            "lag_seconds": round(self.lag_seconds, 1),
        }
        return f"event: status\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


LIVE = StreamStatus("live")


class ReaderHealth:
    """The reader's record of its reads and of the store's head; :meth:`status` judges it.

    The store's error text is logged by the reader, never sent to clients (it may name hosts).
    """

    def __init__(self, threshold: float, now: float) -> None:
        if threshold <= 0:
            raise ValueError(f"threshold must be more than zero, got {threshold!r}")
        self.threshold = threshold
        self._last_ok = now  # a new reader has not failed yet
        self._failing = False
        # The oldest undelivered change known: when it was first seen, and the head then (the
        # reader has delivered it once its position reaches that head).
        self._behind_since: float | None = None
        self._behind_until = 0
        # The newest head seen past the position, and when: the next oldest undelivered change
        # known once the one above is delivered.
        self._newest: tuple[int, float] | None = None

    def read_ok(self, now: float, position: int) -> None:
        """A read of the log finished; the reader's position is now ``position``."""
        self._last_ok = now
        self._failing = False
        if self._behind_since is None or position < self._behind_until:
            return
        if self._newest is not None and self._newest[0] > position:
            self._behind_since, self._behind_until = self._newest[1], self._newest[0]
        else:
            self._behind_since, self._newest = None, None

    def read_failed(self) -> None:
        """A read of the log raised."""
        self._failing = True

    def head_seen(self, now: float, head: int, position: int) -> None:
        """The store's newest change id was ``head`` while the reader stood at ``position``."""
        if head <= position:
            self._behind_since, self._newest = None, None
            return
        if self._behind_since is None:
            self._behind_since, self._behind_until = now, head
        if self._newest is None or head > self._newest[0]:
            self._newest = (head, now)

    def status(self, now: float) -> StreamStatus:
        """``delayed`` past the threshold (see the module docstring), else ``live``."""
        quiet = now - self._last_ok
        if quiet > self.threshold:
            if self._failing:
                return StreamStatus(
                    "delayed", "failing", "the server cannot read its change log", quiet
                )
            return StreamStatus(
                "delayed", "stalled", "the server's read of its change log is not finishing", quiet
            )
        if self._behind_since is not None:
            lag = now - self._behind_since
            if lag > self.threshold:
                return StreamStatus(
                    "delayed", "behind", "the server's live updates are behind its store", lag
                )
        return LIVE
