"""When the send worker makes the next steps its sends marked: right after each send, or on one
background thread that gathers the marks for a moment and makes them together.

A sent step with a next one is marked in the same write as its finish (durable: a crash
leaves the mark for the reconciler). :class:`FollowUpRunner` ``kick`` says a campaign has
new marks. Inline (no ``linger``) the kicking thread makes them at once, as a process that
may be frozen between calls (an AWS Lambda) must. With ``linger``, one thread per worker
process makes them at most ``linger`` seconds later (``SENDQUEUE_FOLLOW_UP_LINGER``), or as
soon as 500 marks of a campaign wait: the next steps of many sends are then made with one
lease, one slot search and one insert (docs/decisions/0008-follow-ups-in-batches.md). A next
step is due hours or sending days later, so the moment costs it nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["FollowUpRunner"]

log = logging.getLogger(__name__)

#: Marks that wake the thread before its linger is over.
_WAKE_AT = 500


class FollowUpRunner:
    """Runs ``make(campaign_id)`` for each campaign kicked (module docstring); ``make``
    makes the campaign's marked next steps and may raise (logged; the marks stay)."""

    def __init__(self, make: Callable[[str], object], *, linger: float | None = None) -> None:
        self._make = make
        self._linger = linger
        self._lock = threading.Lock()
        self._kicked: dict[str, int] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def kick(self, campaign_id: str) -> None:
        """A send of the campaign marked its next step: make it now (inline) or within the
        linger."""
        if self._linger is None:
            self._run(campaign_id)
            return
        with self._lock:
            count = self._kicked.get(campaign_id, 0) + 1
            self._kicked[campaign_id] = count
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="follow-ups", daemon=True)
                self._thread.start()
        if count >= _WAKE_AT:
            self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        """Make what was kicked, then stop the thread (marks left are the reconciler's)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _loop(self) -> None:
        assert self._linger is not None
        while True:
            self._wake.wait(self._linger)
            self._wake.clear()
            with self._lock:
                kicked, self._kicked = list(self._kicked), {}
            for campaign_id in kicked:
                self._run(campaign_id)
            if self._stop.is_set():
                with self._lock:
                    if not self._kicked:
                        return

    def _run(self, campaign_id: str) -> None:
        try:
            self._make(campaign_id)
        except Exception:
            log.exception("campaign %s: next steps not made now; the reconciler will", campaign_id)
