"""An in-memory Scheduler that fires only when a test says so (``fire_due``)."""

from __future__ import annotations

import builtins
import logging
import random
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.domain.errors import Conflict, NotFound
from sendqueue.domain.models import DeadLetter, new_token
from sendqueue.ports import Alarm, Clock, Schedule, Target
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock

__all__ = ["FakeScheduler"]

log = logging.getLogger("sendqueue.scheduler")


@dataclass
class _Entry:
    schedule: Schedule
    in_flight: bool = False


@dataclass(frozen=True)
class _Letter:
    letter: DeadLetter
    timezone: str
    max_retries: int


class FakeScheduler:
    """The Scheduler contract in memory, driven by ``clock`` and by :meth:`fire_due`.

    Same validation, idempotency, retries, dead letters and alarm as the real adapters; nothing
    fires on its own. ``alarm`` defaults to a :class:`RecordingAlarm` (``self.alarm``).
    Thread-safe; a schedule being invoked by one ``fire_due`` is skipped by a concurrent one.
    """

    firing_precision = 0.0  # exact, as the embedded and procrastinate layers

    def __init__(
        self,
        clock: Clock,
        *,
        alarm: Alarm | None = None,
        retry_backoff: float = 5.0,
        max_backoff: float = 300.0,
        seed: int | None = None,
    ) -> None:
        self.clock = clock
        self.alarm: Alarm = alarm if alarm is not None else RecordingAlarm()
        self.retry_backoff = retry_backoff
        self.max_backoff = max_backoff
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._letters: dict[str, _Letter] = {}

    # Scheduler
    def create(
        self,
        name: str,
        group: str,
        at_local: datetime,
        timezone: str,
        payload: Mapping[str, str],
        client_token: str,
        max_retries: int = 2,
    ) -> Schedule:
        schedule = rules.build_schedule(
            name,
            group,
            at_local,
            timezone,
            payload,
            client_token,
            max_retries,
            created_at=self.clock.now(),
        )
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                if entry.schedule.client_token == client_token:
                    return entry.schedule
                raise Conflict(f"schedule {name!r} exists with another client token")
            self._entries[name] = _Entry(schedule)
        return schedule

    def delete(self, name: str) -> None:
        rules.check_name(name)
        with self._lock:
            self._entries.pop(name, None)

    def get(self, name: str) -> Schedule | None:
        rules.check_name(name)
        with self._lock:
            entry = self._entries.get(name)
            return entry.schedule if entry is not None else None

    def list(self, group: str, *, after: str | None = None, limit: int = 1000) -> list[Schedule]:
        rules.check_group(group)
        rules.check_limit(limit)
        with self._lock:
            found = sorted(
                (e.schedule for e in self._entries.values() if e.schedule.group == group),
                key=lambda s: s.name,
            )
        return [s for s in found if after is None or s.name > after][:limit]

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        rules.check_limit(limit)
        with self._lock:
            return [stored.letter for stored in self._letters.values()][:limit]

    def dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        with self._lock:
            stored = self._letters.get(dead_letter_id)
            return stored.letter if stored is not None else None

    def redrive(self, dead_letter_id: str) -> Schedule:
        now = self.clock.now()
        with self._lock:
            stored = self._letters.pop(dead_letter_id, None)
            if stored is None:
                raise NotFound("dead letter", dead_letter_id)
            letter = stored.letter
            existing = self._entries.get(letter.schedule_name)
            if existing is not None:
                return existing.schedule
            schedule = Schedule(
                name=letter.schedule_name,
                group=letter.group,
                at_local=rules.local_now(now, stored.timezone),
                timezone=stored.timezone,
                payload=dict(letter.payload),
                client_token=new_token(),
                due_at=now,
                max_retries=stored.max_retries,
                created_at=now,
            )
            self._entries[schedule.name] = _Entry(schedule)
            return schedule

    def close(self) -> None:
        """Nothing to release; kept for the port."""

    # test hooks
    def fire_due(self, target: Target) -> int:
        """Invoke every schedule due at ``clock.now()`` once, in due order; return how many."""
        now = self.clock.now()
        with self._lock:
            due = sorted(
                (e for e in self._entries.values() if not e.in_flight and e.schedule.due_at <= now),
                key=lambda e: (e.schedule.due_at, e.schedule.name),
            )
            for entry in due:
                entry.in_flight = True
        fired = 0
        try:
            for entry in due:
                fired += 1
                try:
                    target(dict(entry.schedule.payload))
                except Exception as exc:
                    self._failed(entry, exc)
                else:
                    self._succeeded(entry)
        finally:
            with self._lock:
                for entry in due:
                    entry.in_flight = False
        return fired

    def next_due(self) -> datetime | None:
        """The earliest due time of a schedule not in flight, or None when there is none."""
        with self._lock:
            due = [e.schedule.due_at for e in self._entries.values() if not e.in_flight]
        return min(due, default=None)

    def run_until(self, clock: FakeClock, target: Target, until: datetime) -> int:
        """Move ``clock`` from schedule to schedule, firing each at its due time, as a worker
        that never stops would, up to ``until`` (where the clock is left). Returns how many
        invocations ran."""
        fired = 0
        while (due := self.next_due()) is not None and due <= until:
            clock.set(max(due, clock.now()))
            fired += self.fire_due(target)
        clock.set(max(until, clock.now()))
        return fired + self.fire_due(target)

    def lose(self, name: str) -> bool:
        """Drop a schedule silently, as drift between the systems would. True if it existed."""
        with self._lock:
            return self._entries.pop(name, None) is not None

    # internals
    def _succeeded(self, entry: _Entry) -> None:
        with self._lock:
            # Only if it is still the schedule we fired: it may have been deleted or replaced
            # (same name, new token) while the target ran.
            if self._entries.get(entry.schedule.name) is entry:
                del self._entries[entry.schedule.name]

    def _failed(self, entry: _Entry, exc: Exception) -> None:
        now = self.clock.now()
        with self._lock:
            name = entry.schedule.name
            if self._entries.get(name) is not entry:
                return
            attempts = entry.schedule.attempts + 1
            if attempts <= entry.schedule.max_retries:
                delay = rules.retry_delay(attempts, self.retry_backoff, self.max_backoff, self._rng)
                entry.schedule = replace(entry.schedule, attempts=attempts, due_at=now + delay)
                log.warning("schedule %s failed (attempt %d): %s", name, attempts, exc)
                return
            del self._entries[name]
            letter = DeadLetter(
                id="dl-" + secrets.token_hex(8),
                schedule_name=name,
                group=entry.schedule.group,
                payload=dict(entry.schedule.payload),
                error=rules.error_text(exc),
                attempts=attempts,
                failed_at=now,
            )
            self._letters[letter.id] = _Letter(
                letter, entry.schedule.timezone, entry.schedule.max_retries
            )
        try:
            self.alarm.raise_alarm(letter)
        except Exception:
            log.exception("raising the alarm for dead letter %s failed", letter.id)
