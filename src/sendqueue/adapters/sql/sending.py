"""The send worker's two store calls on SQL (``TaskStore.claim_for_send`` and
``TaskStore.finish_send``), each one round trip: on SQLite one ``BEGIN IMMEDIATE`` transaction
on the calling thread's driver connection, on PostgreSQL one statement (CTEs) on a fast-path
connection in autocommit.

The claim reads the task with its campaign's state, its address's suppression entry (by
``tasks.email_key``, the compared form the list keeps) and its booking, and writes Pending ->
Running with its change-log entry only when
:func:`~sendqueue.domain.sendclaim.claim_refusal` finds nothing against it. On SQLite the
transaction holds the write lock, so the read and the write see one state. On PostgreSQL the
UPDATE re-checks the task's state and token on the row's newest version (READ COMMITTED): a
claim or move that committed meanwhile makes it match nothing (TAKEN).

The finish writes Running -> Finished with its entry and, given the slot, counts the task's
booking at that slot sent (the booking row, then its day row: ``mark_sent``'s order), and tells
whether the campaign has other Pending tasks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sendqueue.adapters.sql.rows import TASK_COLUMNS, task_from_row
from sendqueue.adapters.sql.schema import sqlite_text
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Task, utc
from sendqueue.domain.sendclaim import (
    SENDING_STATES,
    ClaimRefusal,
    SendClaim,
    SendFinish,
    refused_claim,
)
from sendqueue.domain.senders import epoch_ms
from sendqueue.domain.suppression import Suppression, SuppressionReason

__all__ = ["PG_UNFINISHED", "pg_claim", "pg_finish", "sqlite_claim", "sqlite_finish"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = [c.strip() for c in TASK_COLUMNS.split(",")]
_WIDTH = len(_COLUMNS)
_PENDING, _RUNNING = TaskState.PENDING.value, TaskState.RUNNING.value
_FINISHED = TaskState.FINISHED.value
_ACCEPTED = TaskOutcome.ACCEPTED.value
_SENDING = sorted(state.value for state in SENDING_STATES)

#: The task with its campaign's state, its address's entry and its booking's instant.
_SNAPSHOT = (
    "SELECT {t}, c.state, s.email, s.reason, s.task_id, s.at, b.at_ms FROM tasks t"
    " JOIN campaigns c ON c.id = t.campaign_id"
    " LEFT JOIN suppressions s ON s.email = t.email_key"
    " LEFT JOIN sender_bookings b ON b.task_id = t.id"
    " WHERE t.id = {mark}"
)

_SQLITE_SNAPSHOT = _SNAPSHOT.format(t=", ".join(f"t.{c}" for c in _COLUMNS), mark="?")
_SQLITE_CLAIM = (
    "UPDATE tasks SET state = ?, claimed_at = ?, attempts = attempts + 1, updated_at = ?"
    f" WHERE id = ? AND state = ? RETURNING {TASK_COLUMNS}"
)
_SQLITE_FINISH = (
    "UPDATE tasks SET state = ?, sent_at = ?, message_id = ?, error = NULL, outcome = ?,"
    " outcome_at = ?, updated_at = ?, follow_up = ? WHERE id = ? AND state = ?"
    f" RETURNING {TASK_COLUMNS}"
)
_LOG_INSERT = (
    "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " VALUES (?, ?, ?, ?, ?, NULL)"
)

#: The claim in one statement: the snapshot, the compare-and-set under the rule's conditions
#: (on the snapshot; the task's state and token also on the row's newest version), its entry.
_PG_CLAIM = (
    "WITH snap AS ({snapshot}),"
    " claimed AS (UPDATE tasks SET state = %(running)s, claimed_at = %(at)s,"
    " attempts = tasks.attempts + 1, updated_at = %(at)s FROM snap"
    " WHERE tasks.id = %(id)s AND tasks.state = %(pending)s AND tasks.token = snap.token"
    " AND snap.state = %(pending)s AND (%(token)s::text IS NULL OR snap.token = %(token)s)"
    " AND snap.send_at <= %(due_by)s"
    " AND (%(not_before)s::timestamptz IS NULL OR snap.send_at >= %(not_before)s)"
    " AND snap.c_state = ANY(%(sending)s::text[]) AND snap.s_email IS NULL"
    " RETURNING {returning}),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT campaign_id, id, %(pending)s, %(running)s, %(at)s, NULL FROM claimed)"
    " SELECT snap.*, claimed.* FROM snap LEFT JOIN claimed ON true"
).format(
    snapshot=_SNAPSHOT.format(t=", ".join(f"t.{c}" for c in _COLUMNS), mark="%(id)s")
    .replace("c.state,", "c.state AS c_state,")
    .replace("s.email,", "s.email AS s_email,")
    .replace("s.reason,", "s.reason AS s_reason,")
    .replace("s.task_id,", "s.task_id AS s_task_id,")
    .replace("s.at,", "s.at AS s_at,")
    .replace("b.at_ms", "b.at_ms AS b_at_ms"),
    returning=", ".join(f"tasks.{c}" for c in _COLUMNS),
)

#: The finish in one statement: the compare-and-set with its entry, the booking at the slot
#: (locked, only once the task is Finished) counted sent with its day, and whether the
#: campaign has other Pending tasks.
_PG_FINISH = (
    "WITH done AS (UPDATE tasks SET state = %(finished)s, sent_at = %(at)s,"
    " message_id = %(message_id)s, error = NULL, outcome = %(accepted)s, outcome_at = %(at)s,"
    " updated_at = %(at)s, follow_up = %(follow_up)s WHERE id = %(id)s AND state = %(running)s"
    f" RETURNING {TASK_COLUMNS}),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT campaign_id, id, %(running)s, %(finished)s, %(at)s, NULL FROM done),"
    " held AS (SELECT b.sender_id, b.day, b.sent FROM sender_bookings b"
    " WHERE b.task_id = %(id)s AND b.at_ms = %(slot)s AND EXISTS (SELECT 1 FROM done)"
    " FOR UPDATE),"
    " marked AS (UPDATE sender_bookings b SET sent = true FROM held"
    " WHERE b.task_id = %(id)s AND NOT held.sent RETURNING b.sender_id, b.day),"
    " counted AS (UPDATE sender_days d SET planned = d.planned - 1, sent = d.sent + 1"
    " FROM marked m WHERE d.sender_id = m.sender_id AND d.day = m.day)"
    f" SELECT {', '.join(f'done.{c}' for c in _COLUMNS)}, (SELECT count(*) FROM held),"
    " EXISTS (SELECT 1 FROM tasks p WHERE p.campaign_id = done.campaign_id"
    " AND p.state = %(pending)s) FROM done"
)

#: Whether a campaign has a task to send or a next step to make: two index probes (the
#: marks' partial index for the second).
PG_UNFINISHED = (
    "SELECT EXISTS (SELECT 1 FROM tasks WHERE campaign_id = %s AND state IN (%s, %s))"
    " OR EXISTS (SELECT 1 FROM tasks WHERE campaign_id = %s AND follow_up)"
)


def _entry(email: str | None, reason: str, task_id: str | None, at: datetime) -> Suppression | None:
    return None if email is None else Suppression(email, SuppressionReason(reason), task_id, at)


def _instant(at_ms: int | None) -> datetime | None:
    return None if at_ms is None else _EPOCH + timedelta(milliseconds=int(at_ms))


def _slot_ms(slot: datetime | None) -> int | None:
    """The booking instant a slot is stored as; None when no booking can be at it (none
    given, or finer than the whole milliseconds bookings keep)."""
    if slot is None:
        return None
    ms = epoch_ms(utc(slot))
    return ms if _instant(ms) == slot else None


def sqlite_claim(
    db: sqlite3.Connection,
    task_of: Callable[[Sequence[Any]], Task],
    task_id: str,
    *,
    token: str | None,
    at: datetime,
    due_by: datetime,
    not_before: datetime | None,
) -> SendClaim:
    """The claim inside the caller's ``BEGIN IMMEDIATE`` transaction on ``db``."""
    found = db.execute(_SQLITE_SNAPSHOT, (task_id,)).fetchall()
    if not found:
        return SendClaim(None, None, ClaimRefusal.NOT_FOUND)
    row = found[0]
    task = task_of(row[:_WIDTH])
    state_value, email, reason, entry_task, entry_at, at_ms = row[_WIDTH:]
    state = CampaignState(state_value)
    entry = None
    if email is not None:
        entry = _entry(
            email, reason, entry_task, datetime.fromisoformat(entry_at).replace(tzinfo=UTC)
        )
    booking_at = _instant(at_ms)
    refused = refused_claim(
        task, state, token=token, suppression=entry, booking_at=booking_at,
        due_by=due_by, not_before=not_before,
    )  # fmt: skip
    if refused is not None:
        return refused
    stamp = sqlite_text(at)
    claimed = db.execute(_SQLITE_CLAIM, (_RUNNING, stamp, stamp, task_id, _PENDING)).fetchall()
    db.execute(_LOG_INSERT, (task.campaign_id, task_id, _PENDING, _RUNNING, stamp))
    return SendClaim(task_of(claimed[0]), state, booking_at=booking_at)


def sqlite_finish(
    db: sqlite3.Connection,
    task_of: Callable[[Sequence[Any]], Task],
    task_id: str,
    *,
    at: datetime,
    message_id: str,
    slot: datetime | None,
    follow_up: bool = False,
) -> SendFinish:
    """The finish inside the caller's ``BEGIN IMMEDIATE`` transaction on ``db``."""
    stamp = sqlite_text(at)
    values = (_FINISHED, stamp, message_id, _ACCEPTED, stamp, stamp, follow_up, task_id, _RUNNING)
    found = db.execute(_SQLITE_FINISH, values).fetchall()
    if not found:
        return SendFinish(None)
    done = task_of(found[0])
    db.execute(_LOG_INSERT, (done.campaign_id, task_id, _RUNNING, _FINISHED, stamp))
    settled = False
    slot_ms = _slot_ms(slot)
    if slot_ms is not None:
        held = db.execute(
            "SELECT sender_id, day, sent FROM sender_bookings WHERE task_id = ? AND at_ms = ?",
            (task_id, slot_ms),
        ).fetchall()
        settled = bool(held)
        if held and not held[0][2]:
            sender_id, day, _ = held[0]
            db.execute("UPDATE sender_bookings SET sent = 1 WHERE task_id = ?", (task_id,))
            db.execute(
                "UPDATE sender_days SET planned = planned - 1, sent = sent + 1"
                " WHERE sender_id = ? AND day = ?",
                (sender_id, day),
            )
    pending = db.execute(
        "SELECT 1 FROM tasks WHERE campaign_id = ? AND state = ? LIMIT 1",
        (done.campaign_id, _PENDING),
    ).fetchall()
    return SendFinish(done, settled, bool(pending))


def pg_claim(
    db: Any,
    task_id: str,
    *,
    token: str | None,
    at: datetime,
    due_by: datetime,
    not_before: datetime | None,
) -> SendClaim:
    """The claim as one statement on the autocommit connection ``db``."""
    due_by = utc(due_by)
    not_before = None if not_before is None else utc(not_before)
    args = {
        "id": task_id,
        "token": token,
        "at": utc(at),
        "due_by": due_by,
        "not_before": not_before,
        "pending": _PENDING,
        "running": _RUNNING,
        "sending": _SENDING,
    }
    found = db.execute(_PG_CLAIM, args).fetchall()
    if not found:
        return SendClaim(None, None, ClaimRefusal.NOT_FOUND)
    row = found[0]
    task = task_from_row(row[:_WIDTH])
    state_value, email, reason, entry_task, entry_at, at_ms = row[_WIDTH : _WIDTH + 6]
    state = CampaignState(state_value)
    entry = _entry(email, reason, entry_task, entry_at.astimezone(UTC)) if email else None
    booking_at = _instant(at_ms)
    claimed = row[_WIDTH + 6 :]
    if claimed[0] is not None:
        return SendClaim(task_from_row(claimed), state, booking_at=booking_at)
    refused = refused_claim(
        task, state, token=token, suppression=entry, booking_at=booking_at,
        due_by=due_by, not_before=not_before,
    )  # fmt: skip
    return refused or SendClaim(task, state, ClaimRefusal.TAKEN, entry, booking_at)


def pg_finish(
    db: Any,
    task_id: str,
    *,
    at: datetime,
    message_id: str,
    slot: datetime | None,
    follow_up: bool = False,
) -> SendFinish:
    """The finish as one statement on the autocommit connection ``db``."""
    args = {
        "id": task_id,
        "follow_up": follow_up,
        "at": utc(at),
        "message_id": message_id,
        "slot": _slot_ms(slot),
        "pending": _PENDING,
        "running": _RUNNING,
        "finished": _FINISHED,
        "accepted": _ACCEPTED,
    }
    found = db.execute(_PG_FINISH, args).fetchall()
    if not found:
        return SendFinish(None)
    row = found[0]
    return SendFinish(task_from_row(row[:_WIDTH]), bool(row[_WIDTH]), bool(row[_WIDTH + 1]))
