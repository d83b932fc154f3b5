"""When the send worker makes the next steps its sends marked: right after each send, or on one
background thread that gathers the marks for a moment and makes them together.

A sent step with a next one is marked in the same write as its finish (durable: a crash
leaves the mark for the reconciler). :class:`FollowUpRunner` ``kick`` says a campaign has
new marks. Inline (no ``linger``) the kicking thread makes them at once, as a process that
may be frozen between calls (an AWS Lambda) must. With ``linger``, one thread per worker
process makes them once no send marked one for ``linger`` seconds
(``SENDQUEUE_FOLLOW_UP_LINGER``), 20 lingers after the first at the latest, or as soon as 500
marks of a campaign wait: the next steps of many sends are then made with one lease, one slot
search and one insert (docs/decisions/0008-follow-ups-in-batches.md). A next step is due hours
or sending days later, so the moment costs it nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["FollowUpRunner"]

log = logging.getLogger(__name__)

#: Marks of one campaign that end the gathering at once.
_WAKE_AT = 500
#: The longest gathering, in lingers: sends that keep coming never hold marks longer.
_LONGEST = 20


class FollowUpRunner:
    """Runs ``make(campaign_id)`` for each campaign kicked (module docstring); ``make``
    makes the campaign's marked next steps and may raise (logged; the marks stay).

    With a linger, the thread gathers kicks until none came for ``linger`` seconds, or 500 of
    a campaign wait, or ``20 x linger`` passed: a burst of sends is made in a few large
    batches, and the last ones of a burst wait one linger."""

    def __init__(self, make: Callable[[str], object], *, linger: float | None = None) -> None:
        self._make = make
        self._linger = linger
        self._cond = threading.Condition()
        self._kicked: dict[str, int] = {}
        self._full = False  # a campaign has _WAKE_AT kicks
        self._last_kick = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None

    def kick(self, campaign_id: str) -> None:
        """A send of the campaign marked its next step: make it now (inline) or soon."""
        if self._linger is None:
            self._run(campaign_id)
            return
        with self._cond:
            first = not self._kicked
            count = self._kicked.get(campaign_id, 0) + 1
            self._kicked[campaign_id] = count
            self._last_kick = time.monotonic()
            if count >= _WAKE_AT:
                self._full = True
            if first or count == _WAKE_AT:  # the thread waits for either, nothing else
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="follow-ups", daemon=True)
                self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Make what was kicked, then stop the thread (marks left are the reconciler's; a
        kick after this is left to them too)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            kicked, stopping = self._gather()
            for campaign_id in kicked:
                self._run(campaign_id)
            if stopping:
                with self._cond:
                    if not self._kicked:
                        return

    def _gather(self) -> tuple[list[str], bool]:
        """Wait for kicks, gather them (class docstring); the campaigns kicked, and whether
        the runner is closing."""
        linger = self._linger
        assert linger is not None
        with self._cond:
            while not self._kicked and not self._stop:
                self._cond.wait()
            started = time.monotonic()
            while not (self._stop or self._full):
                now = time.monotonic()
                left = min(self._last_kick + linger, started + linger * _LONGEST) - now
                if left <= 0:
                    break
                self._cond.wait(left)
            kicked, self._kicked, self._full = list(self._kicked), {}, False
            return kicked, self._stop

    def _run(self, campaign_id: str) -> None:
        try:
            self._make(campaign_id)
        except Exception:
            log.exception("campaign %s: next steps not made now; the reconciler will", campaign_id)
