"""The alarm raised when an invocation lands in the dead-letter queue.

:class:`LoggingAlarm` logs an ERROR line, tells its :class:`~sendqueue.ports.Events` (the
metrics count the letter and the alarm) and, when a webhook URL is configured, POSTs a JSON
description of it::

    {"event": "dead_letter", "id": "...", "schedule": "sq-c1-0", "group": "c1",
     "payload": {"task_id": "c1-0"}, "error": "...", "attempts": 3,
     "failed_at": "2026-12-01T08:00:00+00:00"}

The POST runs on one background daemon thread fed by a bounded queue: the dispatcher that
raises the alarm is never blocked by a slow webhook and never sees its errors (they are logged).
A storm of dead letters beyond the queue's size drops webhook posts, never log lines or counts.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.error
import urllib.parse
import urllib.request

from sendqueue.domain.models import DeadLetter
from sendqueue.ports import Events, NoEvents

__all__ = ["LoggingAlarm", "dead_letter_document"]

log = logging.getLogger("sendqueue.alarm")


def dead_letter_document(letter: DeadLetter) -> dict[str, object]:
    """The JSON document the webhook receives for ``letter``."""
    return {
        "event": "dead_letter",
        "id": letter.id,
        "schedule": letter.schedule_name,
        "group": letter.group,
        "payload": dict(letter.payload),
        "error": letter.error,
        "attempts": letter.attempts,
        "failed_at": letter.failed_at.isoformat(),
    }


class LoggingAlarm:
    """Logs, counts and (optionally) POSTs every dead letter. Thread-safe."""

    def __init__(
        self,
        webhook_url: str | None = None,
        timeout: float = 5.0,
        *,
        queue_size: int = 1000,
        events: Events | None = None,
    ) -> None:
        self.webhook_url = webhook_url or None
        self.events: Events = events if events is not None else NoEvents()
        self.timeout = timeout
        self._queue: queue.Queue[DeadLetter] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def raise_alarm(self, letter: DeadLetter) -> None:
        log.error(
            "dead letter %s: schedule %s (group %s) gave up after %d attempt(s); "
            "payload %s; error: %s",
            letter.id,
            letter.schedule_name,
            letter.group,
            letter.attempts,
            json.dumps(dict(letter.payload), sort_keys=True),
            letter.error,
        )
        self.events.alarm_raised(letter)
        self.events.dead_lettered(letter)
        if self.webhook_url is None:
            return
        try:
            self._queue.put_nowait(letter)
        except queue.Full:
            log.error("alarm webhook queue full; not posting dead letter %s", letter.id)
            return
        self._ensure_thread()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued webhook POST was attempted. False if time ran out.

        Call it before the process exits: the posting thread is a daemon and dies with it.
        """
        done = threading.Event()

        def waiter() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, name="sendqueue-alarm-flush", daemon=True).start()
        return done.wait(timeout)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._post_forever, name="sendqueue-alarm-webhook", daemon=True
                )
                self._thread.start()

    def _post_forever(self) -> None:
        while True:
            letter = self._queue.get()
            try:
                self._post(letter)
            except Exception:
                # Nothing may escape this thread: a dead poster would drop every later alarm.
                log.exception("alarm webhook failed for dead letter %s", letter.id)
            finally:
                self._queue.task_done()

    def _post(self, letter: DeadLetter) -> None:
        url = self.webhook_url
        if url is None:
            return
        body = json.dumps(dead_letter_document(letter)).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "sendqueue-alarm"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            # Webhook URLs often carry a secret in their path: name only the host.
            host = urllib.parse.urlsplit(url).netloc.rsplit("@", 1)[-1]
            log.error("alarm webhook to %s failed for dead letter %s: %s", host, letter.id, exc)
