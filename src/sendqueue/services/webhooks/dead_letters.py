"""Dead letters into the change log, so webhooks hear of them (``dead_letter`` events).

The execution layer keeps its dead letters in its own storage (docs/architecture.md, "Where
the dead-letter queue lives"), so the change-log entry cannot share the dead-letter write's
transaction. :class:`DeadLetterLog` wraps the alarm the layer raises right after that write,
in the same process: it logs the letter's task to the task store first, then raises the
alarm. A process killed between the two writes loses that one event (the letter itself stays
in the queue and is listed by ``sendqueue dlq list``); a store that fails is logged and the
alarm still goes out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sendqueue.domain.alarms import AutoPause
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import Alarm, Clock, FlushableAlarm
from sendqueue.ports.webhooks import WebhookAlarm, WebhookStore

__all__ = ["DeadLetterLog"]

log = logging.getLogger(__name__)


class DeadLetterLog:
    """An :class:`~sendqueue.ports.Alarm` (and a flushable, webhook one) that logs each dead
    letter's task to the change log before the alarm it wraps is raised."""

    def __init__(self, alarm: Alarm, store: Callable[[], WebhookStore], clock: Clock) -> None:
        """``store`` opens the task store when the first letter comes (a process that only
        lists dead letters never opens it)."""
        self.alarm = alarm
        self._store = store
        self._clock = clock

    def raise_alarm(self, letter: DeadLetter) -> None:
        task_id = letter.payload.get("task_id")
        if task_id:
            try:
                self._store().log_dead_letter(task_id, letter.error, at=self._clock.now())
            except Exception:  # the alarm must go out whatever the store does
                log.exception("dead letter %s: not logged for webhooks", letter.id)
        self.alarm.raise_alarm(letter)

    def auto_paused(self, pause: AutoPause) -> None:
        self.alarm.auto_paused(pause)

    def flush(self, timeout: float = 10.0) -> bool:
        return self.alarm.flush(timeout) if isinstance(self.alarm, FlushableAlarm) else True

    def webhook_disabled(self, endpoint_id: str, url: str, reason: str) -> None:
        if isinstance(self.alarm, WebhookAlarm):
            self.alarm.webhook_disabled(endpoint_id, url, reason)
        else:
            log.error("webhook %s disabled: %s", endpoint_id, reason)
