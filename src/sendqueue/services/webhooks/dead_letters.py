"""Dead letters into the change log, so webhooks hear of them (``dead_letter`` events).

The execution layer writes each dead letter to its own storage atomically with the failure
(docs/architecture.md, "Where the dead-letter queue lives"): that storage is the outbox.
:class:`DeadLetterRelay` copies its letters into the task store's change log with
:meth:`~sendqueue.ports.webhooks.WebhookStore.relay_dead_letters`, which writes a marker keyed
by the letter's id and the letter's entry in one transaction, once per letter id. A process
killed at any point therefore loses no event and makes none twice: a letter not relayed yet is
relayed by the next run, in this process or another, and a letter relayed before is skipped.

The relay runs

- at once, from the alarm the layer raises right after it wrote a letter
  (:class:`DeadLetterLog`), so an event follows its failure within a delivery pass;
- from every webhook delivery pass, before it reads the change log, at most once per
  ``interval`` (:meth:`DeadLetterRelay.run`): that is what picks up the letters of a process
  killed before its alarm, and every letter on AWS, where no process sees the failure;
- before a redrive removes a letter (:mod:`sendqueue.services.operations.dead_letters`), so a
redriven
  letter has its event too.

Letters of no task (a control schedule's) make no event and are not relayed. Each process
remembers the ids it relayed (the newest ``remember``), so a run over letters relayed before
costs one listing of the queue and no store call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from sendqueue.domain.alarms import AutoPause
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import DeadLetter
from sendqueue.domain.webhooks import RelayedLetter
from sendqueue.ports import Alarm, FlushableAlarm, Scheduler
from sendqueue.ports.webhooks import WebhookAlarm, WebhookStore

__all__ = ["DeadLetterLog", "DeadLetterRelay"]

log = logging.getLogger(__name__)


class DeadLetterRelay:
    """Copies dead letters into the change log, once per letter id (see the module docstring).

    ``scheduler`` and ``store`` are opened at first use (a process that never meets a letter
    opens neither for it). ``run`` lists the oldest ``limit`` letters at most once per
    ``interval`` seconds. Thread-safe.
    """

    def __init__(
        self,
        scheduler: Callable[[], Scheduler],
        store: Callable[[], WebhookStore],
        *,
        interval: float = 5.0,
        limit: int = 10_000,
        remember: int = 20_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scheduler = scheduler
        self._store = store
        self.interval = interval
        self._limit = limit
        self._remember = remember
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._known: OrderedDict[str, None] = OrderedDict()
        self._last_run: float | None = None

    def run(self, *, force: bool = False) -> list[str]:
        """Relay the queue's oldest letters, unless a run started less than ``interval``
        seconds ago (``force`` runs anyway); the ids of the letters logged now."""
        now = self._monotonic()
        with self._lock:
            if not force and self._last_run is not None and now - self._last_run < self.interval:
                return []
            self._last_run = now
        return self.relay(self._scheduler().dead_letters(limit=self._limit))

    def relay(self, letters: Iterable[DeadLetter]) -> list[str]:
        """Relay ``letters`` (those of a task this process has not relayed) in one store call;
        the ids of the letters whose entries it wrote. Raises what the store raises."""
        todo: list[RelayedLetter] = []
        with self._lock:
            for letter in letters:
                if letter.id in self._known:
                    continue
                try:
                    relayed = RelayedLetter.of(letter)
                except InvalidField as exc:
                    log.error("dead letter %s cannot be relayed for webhooks: %s", letter.id, exc)
                    relayed = None
                if relayed is None:
                    self._remember_ids([letter.id])
                else:
                    todo.append(relayed)
        if not todo:
            return []
        logged = self._store().relay_dead_letters(todo)
        with self._lock:
            self._remember_ids([r.letter_id for r in todo])
        for letter_id in logged:
            log.info("dead letter %s relayed to the change log (a dead_letter event)", letter_id)
        return logged

    def _remember_ids(self, ids: Iterable[str]) -> None:
        """Called with the lock held: the newest ``remember`` ids are kept."""
        for letter_id in ids:
            self._known[letter_id] = None
            self._known.move_to_end(letter_id)
        while len(self._known) > self._remember:
            self._known.popitem(last=False)


class DeadLetterLog:
    """An :class:`~sendqueue.ports.Alarm` (and a flushable, webhook one) that relays each dead
    letter into the change log before the alarm it wraps is raised."""

    def __init__(self, alarm: Alarm, relay: DeadLetterRelay) -> None:
        self.alarm = alarm
        self._relay = relay

    def raise_alarm(self, letter: DeadLetter) -> None:
        try:
            self._relay.relay([letter])
        except Exception:  # the alarm must go out whatever the store does
            log.exception(
                "dead letter %s: not relayed for webhooks now; the next relay run will", letter.id
            )
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
