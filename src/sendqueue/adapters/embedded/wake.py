"""Waking the embedded dispatcher early: in this process and from other processes."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import socket
import tempfile
import threading
from datetime import datetime, timedelta
from pathlib import Path

from sendqueue.adapters.embedded.store import ScheduleFile

__all__ = ["WakeUps"]

log = logging.getLogger("sendqueue.scheduler")

_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 104..108 bytes; keep a margin
_WATCH_INTERVAL = 0.2  # how quickly a set ``stop`` event is noticed


class WakeUps(ScheduleFile):
    """Waking the dispatcher: a condition variable in this process, a datagram on a Unix socket
    in the wake directory for the dispatchers of other processes (best effort)."""

    wake_dir: Path | None
    max_sleep: float
    _cond: threading.Condition
    _wake_seq: int
    _sleep_until: datetime | None
    _own_socket: str | None
    _sender: socket.socket | None

    def _seq(self) -> int:
        with self._cond:
            return self._wake_seq

    def _notify(self) -> None:
        with self._cond:
            self._wake_seq += 1
            self._cond.notify_all()

    def _sleep(self, seq: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, unless something happened since ``seq`` was read."""
        with self._cond:
            if self._wake_seq != seq:
                return
            self._sleep_until = self.clock.now() + timedelta(seconds=timeout)
            self._cond.wait(timeout)
            self._sleep_until = None

    def _wake(self, due: datetime) -> None:
        """A schedule due at ``due`` was added: wake whichever dispatcher would sleep past it."""
        with self._cond:
            # Not asleep (None) may mean "about to sleep on a next-due time read before this
            # schedule existed": bumping the sequence makes that sleep return at once.
            if self._sleep_until is None or due < self._sleep_until:
                self._wake_seq += 1
                self._cond.notify_all()
        if self.wake_dir is None:
            return
        # Another process's dispatcher never sleeps longer than max_sleep; only a schedule due
        # before then can need it earlier.
        if due - self.clock.now() > timedelta(seconds=self.max_sleep):
            return
        self._send_wakeups()

    def _wake_dir(self, wake_path: str | os.PathLike[str] | None) -> Path | None:
        if wake_path is not None:
            return Path(wake_path)
        if self.path == ":memory:" or not hasattr(socket, "AF_UNIX"):
            return None
        real = os.path.realpath(self.path)
        beside = Path(real + ".wake")
        if len(os.fsencode(beside)) + 24 <= _SUN_PATH_MAX:
            return beside
        digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:20]
        return Path(tempfile.gettempdir()) / f"sendqueue-wake-{digest}"

    def _send_wakeups(self) -> None:
        assert self.wake_dir is not None
        try:
            entries = [e for e in os.scandir(self.wake_dir) if e.name.endswith(".sock")]
        except OSError:
            return  # no dispatcher has ever run here
        with self._lock:
            if self._sender is None:
                try:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
                except OSError:
                    return
            sender = self._sender
        for entry in entries:
            if entry.name == self._own_socket:
                continue
            try:
                sender.sendto(b"w", entry.path)
            except OSError as exc:
                # ECONNREFUSED: nobody is bound any more (its process died): tidy up.
                # EAGAIN/ENOBUFS: the dispatcher has wake-ups queued already; that is enough.
                if exc.errno == errno.ECONNREFUSED:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def _bind_wake_socket(self) -> socket.socket | None:
        if self.wake_dir is None:
            return None
        name = f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            try:
                self.wake_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                listener.bind(str(self.wake_dir / name))
            except FileNotFoundError:
                # Another dispatcher removed the empty directory between our mkdir and bind.
                self.wake_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                listener.bind(str(self.wake_dir / name))
        except OSError as exc:
            listener.close()
            log.warning(
                "dispatcher: no wake-up socket in %s (%s); other processes' new schedules "
                "are noticed within %.0f s",
                self.wake_dir,
                exc,
                self.max_sleep,
            )
            return None
        listener.settimeout(_WATCH_INTERVAL)
        self._own_socket = name
        # Probing every socket there removes those left by killed processes (ECONNREFUSED);
        # live dispatchers merely wake up once for nothing.
        self._send_wakeups()
        return listener

    def _unbind_wake_socket(self, listener: socket.socket | None) -> None:
        if listener is None:
            return
        name, self._own_socket = self._own_socket, None
        listener.close()
        if self.wake_dir is not None and name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.wake_dir / name)
            with contextlib.suppress(OSError):
                self.wake_dir.rmdir()  # only succeeds when no other dispatcher is bound there

    def _watch(
        self, stop: threading.Event, done: threading.Event, listener: socket.socket | None
    ) -> None:
        """Turn wake-up datagrams and a set ``stop`` into notifications of the dispatcher."""
        while not done.is_set():
            if stop.is_set():
                self._notify()
                if done.wait(_WATCH_INTERVAL):
                    return
                continue
            if listener is None:
                stop.wait(_WATCH_INTERVAL)
                continue
            try:
                listener.recv(16)
            except TimeoutError:
                continue
            except OSError:
                if done.is_set():
                    return
                listener = None  # broken socket: fall back to watching ``stop``
                continue
            self._notify()
