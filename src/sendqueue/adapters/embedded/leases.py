"""The embedded dispatcher's bookkeeping: claiming leases, retries, dead letters."""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import random
import secrets
import socket
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.embedded.store import (
    COLUMNS,
    from_us,
    payload_json,
    row_to_schedule,
    to_us,
)
from sendqueue.adapters.embedded.wake import WakeUps
from sendqueue.domain.models import DeadLetter
from sendqueue.domain.wording import plural
from sendqueue.ports import Schedule

__all__ = ["LeaseBook"]

log = logging.getLogger("sendqueue.scheduler")


class LeaseBook(WakeUps):
    """Leases, retries and dead letters: the dispatcher's writes to the schedules table."""

    lease_seconds: float
    lookahead: float
    retry_backoff: float
    max_backoff: float
    _rng: random.Random
    _succeeded: builtins.list[tuple[str, str]]
    _succeeded_lock: threading.Lock
    _deferring: bool

    def _new_owner(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    def _claim(
        self, owner: str, now: datetime, *, limit: int | None, ahead: float = 0.0
    ) -> builtins.list[Schedule]:
        """Lease up to ``limit`` schedules due by ``now`` + ``ahead`` seconds (None: all), in
        due order. The lease covers the wait until the due time, then ``lease_seconds``."""
        now_us = to_us(now)
        horizon_us = to_us(now + timedelta(seconds=ahead))
        until = to_us(now + timedelta(seconds=ahead + self.lease_seconds))
        claimed: builtins.list[Schedule] = []
        letters: builtins.list[DeadLetter] = []
        with self._write_deleting_succeeded() as conn:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM schedules WHERE due_at <= ? "
                "AND (lease_owner IS NULL OR (lease_until <= ? AND lease_owner != ?)) "
                "ORDER BY due_at, name LIMIT ?",
                (horizon_us, now_us, owner, -1 if limit is None else limit),
            ).fetchall()
            for row in rows:
                schedule = row_to_schedule(row)
                if row["lease_owner"] is not None:
                    # The invocation that held this lease never finished: count it as failed.
                    schedule = replace(schedule, attempts=schedule.attempts + 1)
                    if schedule.attempts > schedule.max_retries:
                        error = (
                            f"LeaseExpired: the invocation by {row['lease_owner']} did not "
                            "finish before its lease expired (did the process die?)"
                        )
                        letters.append(self._bury(conn, schedule, error, now))
                        continue
                conn.execute(
                    "UPDATE schedules SET lease_owner = ?, lease_until = ?, attempts = ? "
                    "WHERE name = ?",
                    (owner, until, schedule.attempts, schedule.name),
                )
                claimed.append(schedule)
        for letter in letters:
            self._raise_alarm(letter)
        return claimed

    def _bury(
        self, conn: sqlite3.Connection, schedule: Schedule, error: str, now: datetime
    ) -> DeadLetter:
        """Move ``schedule`` to the dead letters (inside the caller's transaction)."""
        letter = DeadLetter(
            id="dl-" + secrets.token_hex(8),
            schedule_name=schedule.name,
            group=schedule.group,
            payload=dict(schedule.payload),
            error=error,
            attempts=schedule.attempts,
            failed_at=now,
        )
        conn.execute(
            "INSERT INTO dead_letters (id, schedule_name, grp, timezone, payload, error, "
            "attempts, max_retries, failed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                letter.id,
                letter.schedule_name,
                letter.group,
                schedule.timezone,
                payload_json(dict(letter.payload)),
                letter.error,
                letter.attempts,
                schedule.max_retries,
                to_us(now),
            ),
        )
        conn.execute("DELETE FROM schedules WHERE name = ?", (schedule.name,))
        log.error(
            "schedule %s moved to the dead letters after %s: %s",
            schedule.name,
            plural(letter.attempts, "attempt"),
            error,
        )
        return letter

    @contextlib.contextmanager
    def _write_deleting_succeeded(self) -> Iterator[sqlite3.Connection]:
        """:meth:`_write`, whose transaction first deletes the schedules whose deferred
        invocations succeeded (see :mod:`sendqueue.adapters.embedded.scheduler`); if it fails,
        they wait for the next one."""
        with self._succeeded_lock:
            taken, self._succeeded = self._succeeded, []
        try:
            with self._write() as conn:
                for name, owner in taken:
                    gone = conn.execute(
                        "DELETE FROM schedules WHERE name = ? AND lease_owner = ?", (name, owner)
                    ).rowcount
                    if not gone:
                        log.info(
                            "schedule %s ran but was deleted, replaced or re-leased meanwhile",
                            name,
                        )
                yield conn
        except BaseException:
            if taken:
                with self._succeeded_lock:
                    self._succeeded[:0] = taken
            raise

    def _record_success(self, schedule: Schedule, owner: str) -> None:
        with self._write() as conn:
            gone = conn.execute(
                "DELETE FROM schedules WHERE name = ? AND lease_owner = ?", (schedule.name, owner)
            ).rowcount
        if not gone:
            log.info(
                "schedule %s ran but was deleted, replaced or re-leased meanwhile", schedule.name
            )

    def _record_failure(self, schedule: Schedule, owner: str, exc: Exception) -> DeadLetter | None:
        now = self.clock.now()
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM schedules WHERE name = ? AND lease_owner = ?",
                (schedule.name, owner),
            ).fetchone()
            if row is None:
                return None  # deleted or replaced while it ran: nothing left to retry
            current = row_to_schedule(row)
            attempts = current.attempts + 1
            if attempts > current.max_retries:
                return self._bury(
                    conn, replace(current, attempts=attempts), rules.error_text(exc), now
                )
            delay = rules.retry_delay(attempts, self.retry_backoff, self.max_backoff, self._rng)
            conn.execute(
                "UPDATE schedules SET attempts = ?, due_at = ?, lease_owner = NULL, "
                "lease_until = NULL WHERE name = ?",
                (attempts, to_us(now + delay), schedule.name),
            )
        log.warning(
            "schedule %s failed (attempt %d of %d), retrying in %.1f s: %s",
            schedule.name,
            attempts,
            current.max_retries + 1,
            delay.total_seconds(),
            rules.error_text(exc),
        )
        return None

    def _renew(self, owner: str) -> None:
        until = to_us(self.clock.now() + timedelta(seconds=self.lease_seconds))
        with self._write() as conn:
            conn.execute(
                "UPDATE schedules SET lease_until = ? WHERE lease_owner = ?", (until, owner)
            )

    def _release(
        self, owner: str, names: set[str] | None, *, keep: set[str] | frozenset[str] = frozenset()
    ) -> None:
        """Give up our leases on ``names`` (None: all of ours) except ``keep``."""
        with self._write_deleting_succeeded() as conn:
            rows = conn.execute(
                "SELECT name FROM schedules WHERE lease_owner = ?", (owner,)
            ).fetchall()
            release = [
                (r["name"],)
                for r in rows
                if (names is None or r["name"] in names) and r["name"] not in keep
            ]
            conn.executemany(
                "UPDATE schedules SET lease_owner = NULL, lease_until = NULL WHERE name = ?",
                release,
            )
        if release:
            self._notify()

    def _next_available(self, owner: str) -> datetime | None:
        """When the next schedule becomes claimable: ``lookahead`` before the earliest free
        due time, or the earliest expiry of someone else's lease."""
        free = self._read(
            "SELECT due_at FROM schedules WHERE lease_owner IS NULL ORDER BY due_at LIMIT 1"
        )
        held = self._read(
            "SELECT lease_until FROM schedules WHERE lease_owner IS NOT NULL "
            "AND lease_owner != ? ORDER BY lease_until LIMIT 1",
            (owner,),
        )
        ahead = timedelta(seconds=self.lookahead)
        times = [from_us(r[0]) - ahead for r in free] + [from_us(r[0]) for r in held]
        return min(times) if times else None
