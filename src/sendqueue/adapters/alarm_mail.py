"""The alarm as an email to an operator (``SENDQUEUE_ALARM_EMAIL``), at most one per interval.

:class:`MailAlarm` gathers the alarms it is given (dead letters, auto-paused campaigns) into a
:class:`~sendqueue.domain.alarms.Digest` and sends it through the configured
:class:`~sendqueue.ports.Mailer`, the one the campaigns use, from one background thread: the
caller (a dispatcher, the send worker) is never blocked by the mail server.

The rate limit holds across processes that share a task store: an email goes out only under
the store lease ``alarm-email``, taken with a fresh owner each time and a time-to-live of the
interval, and never released after a send. While another process (or this one) holds it, the
alarms are held back in this process and go out in its next email, which says so; a process
with alarms held back retries the lease every ``retry_seconds``.

Held-back alarms live in the process's memory. When it stops (``flush``, which the composition
root calls on close), they are sent at once, even inside the interval, rather than lost; a
process killed without a chance to stop loses them (the dead letters and the paused campaigns
themselves stay in the execution layer and the store, and the web UI's banner shows them).
A send that fails keeps its alarms for the next attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta

from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.alarms import AlarmItem, Digest
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, Leases, Mailer, OutgoingMessage

__all__ = ["LEASE", "MailAlarm"]

log = logging.getLogger("sendqueue.alarm")

#: The store lease that allows one alarm email per interval, across processes.
LEASE = "alarm-email"


class MailAlarm:
    """Sends the alarms it is given as digest emails, at most one per ``interval`` seconds.

    With ``background=False`` nothing is sent until :meth:`poll` is called (tests drive it on a
    fake clock); otherwise a daemon thread polls whenever an alarm arrives or the interval ends.
    Thread-safe.
    """

    def __init__(
        self,
        mailer: Mailer,
        store: Leases,
        clock: Clock,
        *,
        to_addr: str,
        from_addr: str,
        interval: float = 600.0,
        max_items: int = 20,
        retry_seconds: float = 30.0,
        background: bool = True,
    ) -> None:
        if interval <= 0 or retry_seconds <= 0:
            raise ValueError("the interval and the retry delay must be more than zero")
        self._mailer = mailer
        self._store = store
        self._clock = clock
        self.to_addr = to_addr
        self.from_addr = from_addr
        self.interval = interval
        self.retry_seconds = retry_seconds
        self._max_items = max_items
        self._background = background
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()  # guards _held and _not_before
        self._send_lock = threading.Lock()  # one send at a time in this process
        self._held = Digest(max_items)
        self._not_before: datetime | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._sent = 0

    @property
    def sent(self) -> int:
        """How many alarm emails this process sent."""
        with self._lock:
            return self._sent

    @property
    def held_back(self) -> int:
        """How many alarms wait for the next email."""
        with self._lock:
            return len(self._held)

    def add(self, item: AlarmItem) -> None:
        """Gather ``item`` into the next email; returns at once."""
        with self._lock:
            self._held.add(item)
        if self._background:
            self._ensure_thread()
            self._wake.set()

    def poll(self) -> float | None:
        """Send what is held back if the interval allows it (under the store lease).

        Returns the seconds after which to poll again, None when nothing is held back.
        """
        with self._send_lock:
            now = self._clock.now()
            with self._lock:
                if not self._held:
                    return None
                if self._not_before is not None and now < self._not_before:
                    return (self._not_before - now).total_seconds()
            owner = f"{self._owner}:{uuid.uuid4().hex}"
            try:
                taken = self._store.acquire_lease(LEASE, owner, ttl_seconds=self.interval, at=now)
            except Exception as exc:  # the store is down: the alarms wait, nothing escapes
                log.error("alarm email: the lease could not be read (%s); retrying", exc)
                taken = False
            if not taken:
                with self._lock:
                    self._not_before = now + _seconds(self.retry_seconds)
                return self.retry_seconds
            if not self._send(now, early=False):
                # Let another attempt (here or in another process) have the interval.
                try:
                    self._store.release_lease(LEASE, owner)
                except Exception as exc:
                    log.warning("alarm email: the lease could not be released: %s", exc)
                with self._lock:
                    self._not_before = now + _seconds(self.retry_seconds)
                return self.retry_seconds
            with self._lock:
                self._not_before = now + _seconds(self.interval)
                return self.interval if self._held else None

    def flush(self, timeout: float = 10.0) -> bool:
        """Send what is held back now, inside the interval if need be: the process is stopping
        and would otherwise lose it. False if alarms are still held back (the send failed)."""
        if not self._send_lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            with self._lock:
                if not self._held:
                    return True
            now = self._clock.now()
            owner = f"{self._owner}:{uuid.uuid4().hex}"
            try:
                in_turn = self._store.acquire_lease(LEASE, owner, ttl_seconds=self.interval, at=now)
            except Exception as exc:
                log.error("alarm email: the lease could not be read (%s); sending anyway", exc)
                in_turn = False
            return self._send(now, early=not in_turn)
        finally:
            self._send_lock.release()

    def _send(self, now: datetime, *, early: bool) -> bool:
        """Send everything held back as one email; on failure keep it. Under ``_send_lock``."""
        with self._lock:
            digest, self._held = self._held, Digest(self._max_items)
        message = OutgoingMessage(
            message_id=message_id_for(f"alarm-{uuid.uuid4().hex}", self.from_addr),
            from_addr=self.from_addr,
            to_addr=self.to_addr,
            subject=digest.subject(),
            text=digest.text(interval=self.interval, early=early),
            date=now,
            headers={"X-Sendqueue-Alarm": str(len(digest))},
        )
        try:
            self._mailer.send(message)
        except Exception as exc:  # kept for the next attempt; nothing escapes to the caller
            kept = plural(len(digest), "alarm")
            log.error("alarm email to %s failed (%s kept): %s", self.to_addr, kept, exc)
            with self._lock:
                self._held = digest.merge(self._held)
            return False
        log.info("alarm email sent to %s: %s", self.to_addr, digest.subject())
        with self._lock:
            self._sent += 1
        return True

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="sendqueue-alarm-email", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        wait: float | None = None
        while True:
            self._wake.wait(wait)
            self._wake.clear()
            try:
                wait = self.poll()
            except Exception:  # a dead thread would silence every later alarm
                log.exception("alarm email: poll failed")
                wait = self.retry_seconds


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
