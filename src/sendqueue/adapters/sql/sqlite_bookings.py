"""The SQLite sender store's statements for a provisioning chunk's bookings: the senders'
check and the day rows' counts, read and written with the driver's own statements.

SQLAlchemy compiled the expanding ``IN`` of these lookups and the update of each day row
on every call, which cost a chunk of a thousand bookings more than the statements did
(docs/performance.md, section 2). The caller holds SQLite's write lock (``BEGIN
IMMEDIATE``), so a count read here cannot change before it is written back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date

from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows

__all__ = ["day_counts", "missing_sender", "set_day_counts"]

_DayKey = tuple[str, date]

#: Keys per lookup: below SQLite's oldest limit of 999 bound parameters.
_KEYS = 400

_SET_DAY = (
    "INSERT INTO sender_days (sender_id, day, planned, sent) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (sender_id, day) DO UPDATE SET planned = excluded.planned, sent = excluded.sent"
)


def missing_sender(conn: Connection, sender_ids: Sequence[str]) -> str | None:
    """The first of ``sender_ids`` that has no row, or None."""
    found: set[str] = set()
    for part in rows.chunks(sender_ids, _KEYS):
        marks = ", ".join("?" * len(part))
        statement = f"SELECT id FROM senders WHERE id IN ({marks})"
        found.update(row[0] for row in conn.exec_driver_sql(statement, tuple(part)))
    return next((sender for sender in sender_ids if sender not in found), None)


def day_counts(conn: Connection, days: Sequence[_DayKey]) -> dict[_DayKey, tuple[int, int]]:
    """(planned, sent) of each of ``days``: (0, 0) for a day that has no row yet."""
    counts: dict[_DayKey, tuple[int, int]] = {}
    for part in rows.chunks(days, _KEYS):
        marks = ", ".join(["(?, ?)"] * len(part))
        statement = (  # a join, not a row-value IN, which SQLite answers with a full scan
            f"SELECT d.sender_id, d.day, d.planned, d.sent FROM (VALUES {marks}) AS v"
            " JOIN sender_days AS d ON d.sender_id = v.column1 AND d.day = v.column2"
        )
        params = tuple(value for sender, day in part for value in (sender, day.isoformat()))
        for sender, day, planned, sent in conn.exec_driver_sql(statement, params):
            counts[(sender, date.fromisoformat(day))] = (int(planned), int(sent))
    return {key: counts.get(key, (0, 0)) for key in days}


def set_day_counts(conn: Connection, counts: Mapping[_DayKey, tuple[int, int]]) -> None:
    """Write each day row's (planned, sent), inserting the rows not there yet."""
    conn.exec_driver_sql(
        _SET_DAY,
        [
            (sender, day.isoformat(), planned, sent)
            for (sender, day), (planned, sent) in sorted(counts.items())
        ],
    )
