"""What needs a person now: the dead letters waiting and the campaigns paused by failures.

Every web page shows it in a banner (:mod:`sendqueue.web.rendering`), read through an
:class:`AttentionCache`: at most one read of the store and the execution layer per ``ttl``
seconds, however many pages are served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sendqueue.domain.alarms import is_auto_paused
from sendqueue.domain.errors import InfrastructureError
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.ports import Campaigns, Scheduler

__all__ = ["Attention", "AttentionCache", "PausedByFailure", "read_attention"]

log = logging.getLogger(__name__)

#: Dead letters counted for the banner; beyond this it says "100+".
DEAD_LETTERS_COUNTED = 100


@dataclass(frozen=True)
class PausedByFailure:
    """A campaign the send worker paused after too many failed sends in a row."""

    id: str
    name: str
    reason: str


@dataclass(frozen=True)
class Attention:
    """The banner's content. ``dead_letters`` is None when the execution layer did not answer;
    ``more_dead_letters`` when there are more than it counts."""

    dead_letters: int | None
    more_dead_letters: bool
    paused: tuple[PausedByFailure, ...]

    @property
    def needed(self) -> bool:
        return bool(self.dead_letters) or bool(self.paused)


def read_attention(
    store: Campaigns, scheduler: Scheduler, *, count: int = DEAD_LETTERS_COUNTED
) -> Attention:
    """Read it now; a part whose backend fails is left out (logged), never raised."""
    letters: int | None = None
    more = False
    try:
        found = len(scheduler.dead_letters(limit=count + 1))
        letters, more = min(found, count), found > count
    except InfrastructureError as exc:
        log.warning("banner: the dead letters are unknown: %s", exc)
    paused: tuple[PausedByFailure, ...] = ()
    try:
        paused = tuple(
            PausedByFailure(c.id, c.name, c.state_reason or "")
            for c in store.list_campaigns()
            if c.state is CampaignState.PAUSED and is_auto_paused(c.state_reason)
        )
    except InfrastructureError as exc:
        log.warning("banner: the paused campaigns are unknown: %s", exc)
    return Attention(letters, more, paused)


class AttentionCache:
    """:func:`read_attention`'s result, read again at most once per ``ttl`` seconds.

    One reader at a time: requests that arrive during a read wait for it rather than all
    reading too. Thread-safe.
    """

    def __init__(
        self,
        read: Callable[[], Attention],
        *,
        ttl: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._ttl = ttl
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._value: Attention | None = None
        self._read_at = 0.0

    def get(self) -> Attention:
        with self._lock:
            now = self._monotonic()
            if self._value is None or now - self._read_at >= self._ttl:
                self._value = self._read()
                self._read_at = now
            return self._value
