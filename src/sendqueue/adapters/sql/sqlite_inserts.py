"""The SQLite task store's bulk insert of tasks: :func:`insert_tasks`.

A batch of new tasks (every column a task only gets once it is sent, moved or answered still
NULL) is inserted without binding those NULLs: its statement leaves them out, and the columns
of the batch that are None in every row too. The driver adapts each bound None through its
adapter lookup, which made the twelve NULLs of a new task's thirty columns most of what binding
its row cost (measured: docs/performance.md, section 2). Any other batch binds every column.

Rows go in as multi-row statements (:func:`insert_values`): one ``INSERT ... VALUES (...),
(...), ...`` per part of the batch instead of the driver's ``executemany``, which steps and
resets its statement once per row from Python. Their marks are plain ``?``, a value bound as
often as it is used: SQLite prepares numbered marks (``?NNN``) in time that grows with the
square of their count (0.12 s for a thousand rows of ten, against 4 ms for plain marks).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from itertools import chain
from operator import attrgetter

from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql.rows import INSERT_COLUMNS, TASK_WIDTH
from sendqueue.adapters.sql.schema import sqlite_text
from sendqueue.domain.models import Task
from sendqueue.domain.suppression import key_of_normalized

__all__ = ["IN_LIMIT", "insert_tasks", "insert_values", "task_row"]

#: Every column, every row: the insert (and one row's marks) for tasks that are not all new.
_INTO_TASKS = f"INSERT INTO tasks ({INSERT_COLUMNS})"
_TASK_MARKS = f"({', '.join('?' * (TASK_WIDTH + 1))})"

#: Rows per multi-row statement at most (fewer when the driver's limit on bound parameters
#: says so): a provisioning chunk's thousand in one, and a prepared statement of bounded size.
VALUES_ROWS = 1_000

#: Values per ``IN (...)`` lookup: below SQLite's oldest limit on bound parameters (999).
IN_LIMIT = 900

#: None in every new task: what only a later write sets (the claim, the send, a move, the
#: outcome), and ``planned_at``, which the insert takes from ``send_at`` when it is None.
_later = attrgetter(
    "claimed_at", "sent_at", "message_id", "error", "moved_reason", "outcome",
    "outcome_detail", "outcome_at", "planned_at",
)  # fmt: skip
_NONE_LATER = (None,) * 9

#: A new task's columns bound as they are, every row.
_ALWAYS = (
    "id", "campaign_id", "position", "email", "name", "subject", "text", "token", "attempts",
    "moves", "step",
)  # fmt: skip

#: A new task's columns that may be None in every row of a batch (then left out).
_MAYBE = ("html", "reason", "sender_id", "sender", "timezone")


def task_row(t: Task, stamp: str | None) -> tuple[object, ...]:
    """The driver's parameters of :data:`_INTO_TASKS` for a task, created and updated
    ``stamp``."""
    send_at = sqlite_text(t.send_at)
    # A new task's optional instants are None: tested here, not in a call per column.
    claimed_at, sent_at, outcome_at = t.claimed_at, t.sent_at, t.outcome_at
    planned_at = t.planned_at
    return (
        t.id, t.campaign_id, t.position, t.email, t.name, t.subject, t.text, t.html,
        send_at, t.state.value, t.token, t.attempts,
        None if claimed_at is None else sqlite_text(claimed_at),
        None if sent_at is None else sqlite_text(sent_at), t.message_id, t.error, stamp, stamp,
        send_at if planned_at is None else sqlite_text(planned_at), t.moves,
        t.moved_reason, t.reason,
        None if t.outcome is None else t.outcome.value, t.outcome_detail,
        None if outcome_at is None else sqlite_text(outcome_at), t.sender_id, t.sender,
        t.timezone, t.step, key_of_normalized(t.email),
    )  # fmt: skip


@lru_cache(maxsize=32)  # one per subset of _MAYBE
def _new_statement(
    present: tuple[str, ...],
) -> tuple[str, str, Callable[[Task], tuple[object, ...]]]:
    """The insert of new tasks that have the ``present`` columns of :data:`_MAYBE`, one row's
    marks, and the getter of the row's first values."""
    named = _ALWAYS + present
    columns = (*named, "send_at", "planned_at", "state", "email_key", "created_at", "updated_at")
    into = f"INSERT INTO tasks ({', '.join(columns)})"
    return into, f"({', '.join('?' * len(columns))})", attrgetter(*named)


def _new_rows(
    tasks: Sequence[Task], stamp: str
) -> tuple[str, str, list[tuple[object, ...]]] | None:
    """The insert, one row's marks and the rows of a batch of new tasks (see the module
    docstring), or None when some task is not new."""
    for t in tasks:
        if _later(t) != _NONE_LATER:
            return None
    present = tuple(
        column for column in _MAYBE if any(getattr(t, column) is not None for t in tasks)
    )
    into, marks, first = _new_statement(present)
    rows_ = []
    for t in tasks:
        send_at = sqlite_text(t.send_at)
        rows_.append(
            (*first(t), send_at, send_at, t.state.value, key_of_normalized(t.email), stamp, stamp)
        )
    return into, marks, rows_


@lru_cache(maxsize=32)
def _values_statement(into: str, marks: str, count: int) -> str:
    return f"{into} VALUES {', '.join([marks] * count)} ON CONFLICT DO NOTHING"


def insert_values(
    conn: Connection, into: str, marks: str, values: Sequence[Sequence[object]]
) -> int:
    """``{into} VALUES {marks}, {marks}, ... ON CONFLICT DO NOTHING`` over ``values`` (rows
    of as many values as ``marks`` has ``?``), as few statements as the driver's limit on
    bound parameters allows; returns how many rows were taken (a conflicting one is
    skipped, and a later row that clashes with an earlier one of the call too)."""
    if not values:
        return 0
    width = len(values[0])
    driver = conn.connection.driver_connection
    # SQLite's oldest limit (999) if the driver's connection is not at hand.
    limit = 999 if driver is None else driver.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    most = max(1, min(VALUES_ROWS, limit // width))
    taken = start = 0
    while start < len(values):
        # Full statements, then the rest in powers of two: few distinct statements, as the
        # driver keeps up to 128 prepared ones per connection (a thousand rows' is ~2.6 MB).
        left = len(values) - start
        count = most if left >= most else 1 << (left.bit_length() - 1)
        part = values[start : start + count]
        start += count
        flat = tuple(chain.from_iterable(part))  # a tuple: a list would be many rows to SQLAlchemy
        taken += conn.exec_driver_sql(_values_statement(into, marks, count), flat).rowcount
    return taken


def insert_tasks(conn: Connection, tasks: Sequence[Task], at: datetime) -> list[str]:
    """Insert the tasks whose id and (campaign, position, step) are free; returns the ids
    inserted.

    The caller holds SQLite's write lock (BEGIN IMMEDIATE), so the rows taken cannot change
    between the lookup (run only when the plain insert skipped a row) and the INSERT; the
    first of two tasks with one id or position and step wins, as with ON CONFLICT DO NOTHING.
    """
    stamp = sqlite_text(at)
    assert stamp is not None
    # The common case, a fresh chunk: insert everything at once and count the rows taken; if
    # some were skipped (a resumed run, a duplicate), undo and redo with the lookups below.
    conn.exec_driver_sql("SAVEPOINT sq_bulk_tasks")
    into, row_marks, values = _new_rows(tasks, stamp) or (
        _INTO_TASKS,
        _TASK_MARKS,
        [task_row(t, stamp) for t in tasks],
    )
    taken = insert_values(conn, into, row_marks, values)
    if taken == len(tasks):
        conn.exec_driver_sql("RELEASE SAVEPOINT sq_bulk_tasks")
        return [t.id for t in tasks]
    conn.exec_driver_sql("ROLLBACK TO SAVEPOINT sq_bulk_tasks")
    conn.exec_driver_sql("RELEASE SAVEPOINT sq_bulk_tasks")
    taken_ids: set[str] = set()
    taken_positions: set[tuple[str, int, int]] = set()
    for part in rows.chunks([t.id for t in tasks], IN_LIMIT):
        marks = ", ".join("?" * len(part))
        taken_ids.update(
            row[0]
            for row in conn.exec_driver_sql(
                f"SELECT id FROM tasks WHERE id IN ({marks})", tuple(part)
            )
        )
    by_campaign: dict[str, list[int]] = {}
    for t in tasks:
        by_campaign.setdefault(t.campaign_id, []).append(t.position)
    for campaign_id, positions in by_campaign.items():
        for some in rows.chunks(positions, IN_LIMIT):
            marks = ", ".join("?" * len(some))
            taken_positions.update(
                (campaign_id, row[0], row[1])
                for row in conn.exec_driver_sql(
                    "SELECT position, step FROM tasks"
                    f" WHERE campaign_id = ? AND position IN ({marks})",
                    (campaign_id, *some),
                )
            )
    inserted: list[str] = []
    params: list[tuple[object, ...]] = []
    for t, row in zip(tasks, values, strict=True):
        where = (t.campaign_id, t.position, t.step)
        if t.id in taken_ids or where in taken_positions:
            continue
        taken_ids.add(t.id)
        taken_positions.add(where)
        inserted.append(t.id)
        params.append(row)  # the rows built above, for the statement they were built for
    insert_values(conn, into, row_marks, params)
    return inserted
