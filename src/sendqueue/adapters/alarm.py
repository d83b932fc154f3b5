"""The alarm raised when an invocation lands in the dead-letter queue or a campaign is
auto-paused.

:class:`LoggingAlarm` logs an ERROR line for a dead letter (the send worker logs its own for an
auto-pause), tells its :class:`~sendqueue.ports.Events` (the metrics count the letter and the
alarm) and, on up to two channels a person reads:

- a webhook (``SENDQUEUE_ALARM_WEBHOOK``), POSTed a JSON description of each alarm::

    {"event": "dead_letter", "id": "...", "schedule": "sq-c1-0", "group": "c1",
     "payload": {"task_id": "c1-0"}, "error": "...", "attempts": 3,
     "failed_at": "2026-12-01T08:00:00+00:00"}
    {"event": "auto_pause", "campaign_id": "c1", "campaign_name": "...",
     "reason": "auto-paused after 5 failed sends in a row; ...",
     "paused_at": "2026-12-01T08:00:00+00:00"}

- an email (``SENDQUEUE_ALARM_EMAIL``), a digest at most once per interval: see
  :class:`~sendqueue.adapters.alarm_mail.MailAlarm`.

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
from collections.abc import Mapping

from sendqueue.adapters.alarm_mail import MailAlarm
from sendqueue.domain.alarms import AutoPause
from sendqueue.domain.models import DeadLetter
from sendqueue.domain.wording import plural
from sendqueue.ports import Events, NoEvents

__all__ = [
    "LoggingAlarm",
    "auto_pause_document",
    "dead_letter_document",
    "post_json",
    "webhook_host",
]

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


def auto_pause_document(pause: AutoPause) -> dict[str, object]:
    """The JSON document the webhook receives for an auto-paused campaign."""
    return {
        "event": "auto_pause",
        "campaign_id": pause.campaign_id,
        "campaign_name": pause.campaign_name,
        "reason": pause.reason,
        "paused_at": pause.paused_at.isoformat(),
    }


def post_json(url: str, document: Mapping[str, object], timeout: float) -> None:
    """POST ``document`` as JSON to ``url``; raises OSError (URLError) or ValueError on failure.

    urllib rather than an HTTP client library: one POST with a timeout needs nothing more, and
    the Lambda bundle stays small.
    """
    request = urllib.request.Request(
        url,
        data=json.dumps(document).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "sendqueue-alarm"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


def webhook_host(url: str) -> str:
    """Only the host of a webhook URL, for log lines (its path often carries a secret)."""
    return urllib.parse.urlsplit(url).netloc.rsplit("@", 1)[-1]


class LoggingAlarm:
    """Logs, counts and (optionally) POSTs and emails every alarm. Thread-safe."""

    def __init__(
        self,
        webhook_url: str | None = None,
        timeout: float = 5.0,
        *,
        queue_size: int = 1000,
        events: Events | None = None,
        mail: MailAlarm | None = None,
    ) -> None:
        self.webhook_url = webhook_url or None
        self.events: Events = events if events is not None else NoEvents()
        self.mail = mail
        self.timeout = timeout
        self._queue: queue.Queue[tuple[str, dict[str, object]]] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def raise_alarm(self, letter: DeadLetter) -> None:
        log.error(
            "dead letter %s: schedule %s (group %s) gave up after %s; payload %s; error: %s",
            letter.id,
            letter.schedule_name,
            letter.group,
            plural(letter.attempts, "attempt"),
            json.dumps(dict(letter.payload), sort_keys=True),
            letter.error,
        )
        self.events.alarm_raised(letter)
        self.events.dead_lettered(letter)
        if self.mail is not None:
            self.mail.add(letter)
        self._enqueue(f"dead letter {letter.id}", dead_letter_document(letter))

    def auto_paused(self, pause: AutoPause) -> None:
        # The send worker logged the pause at ERROR already.
        self.events.alarm_raised(pause)
        if self.mail is not None:
            self.mail.add(pause)
        self._enqueue(f"auto-pause of {pause.campaign_id}", auto_pause_document(pause))

    def webhook_disabled(self, endpoint_id: str, url: str, reason: str) -> None:
        """:class:`~sendqueue.ports.webhooks.WebhookAlarm`: an endpoint was disabled."""
        host = webhook_host(url)
        log.error("webhook %s (%s) disabled: %s", endpoint_id, host, reason)
        document: dict[str, object] = {
            "event": "webhook_disabled",
            "endpoint_id": endpoint_id,
            "host": host,
            "reason": reason,
        }
        self._enqueue(f"webhook {endpoint_id} disabled", document)

    def _enqueue(self, what: str, document: dict[str, object]) -> None:
        if self.webhook_url is None:
            return
        try:
            self._queue.put_nowait((what, document))
        except queue.Full:
            log.error("alarm webhook queue full; not posting %s", what)
            return
        self._ensure_thread()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued webhook POST was attempted and every held-back alarm email
        went out (at once, see :meth:`MailAlarm.flush`). False if time ran out or the email
        failed.

        Call it before the process exits: the posting threads are daemons and die with it.
        """
        done = threading.Event()

        def waiter() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, name="sendqueue-alarm-flush", daemon=True).start()
        posted = done.wait(timeout)
        mailed = self.mail.flush(timeout) if self.mail is not None else True
        return posted and mailed

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._post_forever, name="sendqueue-alarm-webhook", daemon=True
                )
                self._thread.start()

    def _post_forever(self) -> None:
        while True:
            what, document = self._queue.get()
            try:
                self._post(what, document)
            except Exception:
                # Nothing may escape this thread: a dead poster would drop every later alarm.
                log.exception("alarm webhook failed for %s", what)
            finally:
                self._queue.task_done()

    def _post(self, what: str, document: dict[str, object]) -> None:
        url = self.webhook_url
        if url is None:
            return
        try:
            post_json(url, document, self.timeout)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            # Webhook URLs often carry a secret in their path: name only the host.
            log.error("alarm webhook to %s failed for %s: %s", webhook_host(url), what, exc)
