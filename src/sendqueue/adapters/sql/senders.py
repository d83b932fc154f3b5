"""The sender store on SQL (:class:`SenderTables`, a base of
:class:`~sendqueue.adapters.sql.base.SqlTaskStore`): the same statements on both databases.

How :meth:`~SenderTables.book` keeps the contract (all or nothing, never past a cap, across
processes), in one write transaction:

1. the senders named are read ``FOR KEY SHARE`` (an unknown one is NotFound; a concurrent
   ``remove_sender``, which locks its row ``FOR UPDATE``, waits or is waited for);
2. the bookings the call's tasks hold already are read and locked (``FOR UPDATE``, in task id
   order): a task booked on the same slot again is left alone, any other is *moved*;
3. a slot held by another task refuses the call (Overbooked with ``at``);
4. each day row the call touches is inserted as zeros if missing (``ON CONFLICT DO NOTHING``)
   and then read and locked ``FOR UPDATE`` in (sender, day) order, so concurrent bookers of one
   day queue on its row and see each other's counts; the call's bookings are checked against
   the lowest cap given per day (Overbooked with ``day``);
5. the moved tasks' old rows are deleted, the day rows set to their new counts, the new rows
   inserted in (sender, slot) order with ``ON CONFLICT DO NOTHING RETURNING``: a row refused
   there was taken concurrently (Overbooked, and the whole transaction rolls back);
6. the sticky senders of the recipients new to the books are inserted, first one kept.

On SQLite the transaction begins ``BEGIN IMMEDIATE`` (the store's writer), so the whole call is
serialised against every other writer and ``FOR UPDATE`` (which SQLite lacks) is not needed.
On PostgreSQL (READ COMMITTED) the locks above are taken in one order by every call (senders,
then the tasks' bookings by task id, then day rows by (sender, day), then new slots by (sender,
slot)), and ``release`` / ``mark_sent`` take theirs in the same order: no deadlocks among them.
Row-lock order follows Python's order of the keys (``COLLATE "C"`` where SQL sorts text).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar, NamedTuple

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.adapters.sql.sqlite_bookings import day_counts, missing_sender, set_day_counts
from sendqueue.adapters.sql.sqlite_inserts import insert_values
from sendqueue.domain.errors import Conflict, NotFound, Overbooked
from sendqueue.domain.models import utc
from sendqueue.domain.senders import Booking, OAuthGrant, Sender, SenderDay, epoch_ms

__all__ = ["SenderTables"]

_S = tables.senders.c
_B = tables.sender_bookings.c
_D = tables.sender_days.c
_C = tables.sender_contacts.c
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Values per ``IN (...)`` lookup and rows per INSERT (below SQLite's oldest limit of 999
#: bound parameters for the lookups; 500 rows of 8 columns for the inserts).
_CHUNK = 500

#: The inserts of booking rows and of sticky contacts, and one row's marks (``mark``: the
#: driver's parameter mark); see :meth:`SenderTables._insert_new`.
_INTO_BOOKINGS = (
    "INSERT INTO sender_bookings (sender_id, at_ms, task_id, campaign_id, day, recipient, cap, "
    "sent)"
)
_BOOKING_MARKS = "({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark}, FALSE)"
_INTO_CONTACTS = "INSERT INTO sender_contacts (recipient, sender_id)"
_CONTACT_MARKS = "({mark}, {mark})"

_DayKey = tuple[str, date]
_SlotKey = tuple[str, int]


class _Held(NamedTuple):
    """A booking as stored: what a move or a release needs of it."""

    task_id: str
    sender_id: str
    at_ms: int
    day: date
    sent: bool


def _instant(at_ms: int) -> datetime:
    """The aware UTC instant of a slot key."""
    return _EPOCH + timedelta(milliseconds=at_ms)


def _sender_row(sender: Sender) -> dict[str, Any]:
    return {
        "id": sender.id,
        "email": sender.email,
        "email_key": sender.email.lower(),
        "name": sender.name,
        "reply_to": sender.reply_to,
        "transport": sender.transport,
        "daily_cap": sender.daily_cap,
        "min_gap_seconds": sender.min_gap_seconds,
        "timezone": sender.timezone,
        "warmup_start": sender.warmup_start,
        "warmup_step": sender.warmup_step,
        "warmup_from": sender.warmup_from,
        "imap": sender.imap,
        "signature_text": sender.signature_text,
        "signature_html": sender.signature_html,
        "oauth": None if sender.oauth is None else sender.oauth.as_dict(),
    }


def _sender(row: sa.Row[Any]) -> Sender:
    m = row._mapping
    return Sender(
        id=m["id"],
        email=m["email"],
        name=m["name"],
        reply_to=m["reply_to"],
        transport=m["transport"],
        daily_cap=m["daily_cap"],
        min_gap_seconds=m["min_gap_seconds"],
        timezone=m["timezone"],
        warmup_start=m["warmup_start"],
        warmup_step=m["warmup_step"],
        warmup_from=m["warmup_from"],
        imap=m["imap"],
        signature_text=m["signature_text"] or "",
        signature_html=m["signature_html"],
        oauth=OAuthGrant.from_dict(m["oauth"]),
    )


class SenderTables(ABC):
    """:class:`~sendqueue.ports.SenderStore` over the store's transactions."""

    #: The SQLAlchemy dialect name of the store (see SqlTaskStore).
    dialect: ClassVar[str]
    #: The dialect's ``insert()`` (both spell ON CONFLICT the same way, through their own).
    _insert: ClassVar[Any]

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Connection]:
        """A write transaction (see SqlTaskStore)."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read-only connection (see SqlTaskStore)."""

    def _lock_order(self, *columns: sa.ColumnElement[Any]) -> list[sa.ColumnElement[Any]]:
        """ORDER BY terms that lock rows in Python's order of the keys: text in byte order
        (``COLLATE "C"``) on PostgreSQL; nothing on SQLite, where the writer holds the whole
        database and ``FOR UPDATE`` is not rendered."""
        if self.dialect != "postgresql":
            return []
        return [c.collate("C") if isinstance(c.type, sa.String) else c for c in columns]

    # senders ---------------------------------------------------------------------------------

    def add_sender(self, sender: Sender) -> None:
        row = _sender_row(sender)
        with self._write("add a sender") as conn:
            taken = conn.execute(
                sa.select(_S.id).where(sa.or_(_S.id == sender.id, _S.email_key == row["email_key"]))
            ).scalars()
            for other in taken:
                if other == sender.id:
                    raise Conflict(f"sender {sender.id} exists")
                raise Conflict(f"the address {sender.email} belongs to sender {other}")
            try:
                conn.execute(sa.insert(tables.senders), row)
            except sa_exc.IntegrityError as exc:  # added concurrently
                raise Conflict(
                    f"sender {sender.id} or the address {sender.email} is taken"
                ) from exc

    def get_sender(self, sender_id: str) -> Sender:
        with self._read("get a sender") as conn:
            found = conn.execute(sa.select(tables.senders).where(_S.id == sender_id)).first()
        if found is None:
            raise NotFound("sender", sender_id)
        return _sender(found)

    def list_senders(self) -> list[Sender]:
        with self._read("list senders") as conn:
            found = conn.execute(sa.select(tables.senders)).all()
        # Sorted here, not by SQL: the database's collation need not be Python's order. A
        # deployment has a handful of senders.
        return sorted(map(_sender, found), key=lambda s: (s.email.lower(), s.id))

    def update_sender(self, sender: Sender) -> None:
        row = _sender_row(sender)
        with self._write("update a sender") as conn:
            exists = conn.execute(
                sa.select(_S.id).where(_S.id == sender.id).with_for_update()
            ).first()
            if exists is None:
                raise NotFound("sender", sender.id)
            other = conn.execute(
                sa.select(_S.id).where(_S.email_key == row["email_key"], _S.id != sender.id)
            ).scalar()
            if other is not None:
                raise Conflict(f"the address {sender.email} belongs to sender {other}")
            try:
                conn.execute(sa.update(tables.senders).where(_S.id == sender.id).values(row))
            except sa_exc.IntegrityError as exc:  # the address taken concurrently
                raise Conflict(f"the address {sender.email} is taken") from exc

    def remove_sender(self, sender_id: str) -> None:
        with self._write("remove a sender") as conn:
            # FOR UPDATE: a concurrent book() (FOR KEY SHARE on this row) waits, or is waited
            # for and then counted below.
            exists = conn.execute(
                sa.select(_S.id).where(_S.id == sender_id).with_for_update()
            ).first()
            if exists is None:
                raise NotFound("sender", sender_id)
            planned = conn.execute(
                sa.select(sa.func.count()).where(_B.sender_id == sender_id, _B.sent == sa.false())
            ).scalar_one()
            if planned:
                raise Conflict(
                    f"sender {sender_id} has {planned} planned sends; cancel or re-plan them first"
                )
            conn.execute(sa.delete(tables.sender_bookings).where(_B.sender_id == sender_id))
            conn.execute(sa.delete(tables.sender_days).where(_D.sender_id == sender_id))
            conn.execute(sa.delete(tables.senders).where(_S.id == sender_id))

    # bookings --------------------------------------------------------------------------------

    def book(self, bookings: Sequence[Booking]) -> None:
        if bookings:
            with self._write("book sender slots") as conn:
                self._book(conn, bookings)

    def _book(self, conn: Connection, bookings: Sequence[Booking]) -> None:
        """:meth:`book` in the caller's write transaction (which rolls back on Overbooked)."""
        # A task named twice in one call ends where its last booking says.
        latest: dict[str, Booking] = {}
        for booking in bookings:
            latest.pop(booking.task_id, None)
            latest[booking.task_id] = booking
        if not latest:
            return
        wanted = list(latest.values())
        claimed: dict[_SlotKey, str] = {}
        for booking in wanted:
            if claimed.setdefault(_slot(booking), booking.task_id) != booking.task_id:
                raise Overbooked(booking.sender_id, at=booking.at)
        self._require_senders(conn, {b.sender_id for b in wanted})
        if self.dialect == "sqlite" and self._book_new(conn, wanted):
            return
        old = self._held(conn, sorted(latest), planned_only=False)
        todo = [
            b
            for b in wanted
            if (held := old.get(b.task_id)) is None or (held.sender_id, held.at_ms) != _slot(b)
        ]
        if not todo:
            return
        # A slot another task of the call still holds is taken, even if that task moves
        # away in this call (as every store has it: the call is checked before it writes).
        holding = {(h.sender_id, h.at_ms): h.task_id for h in old.values()}
        for b in todo:
            if holding.get(_slot(b), b.task_id) != b.task_id:
                raise Overbooked(b.sender_id, at=b.at)
        # A slot another task holds is refused by the slot's primary key when the rows go
        # in (_insert_rows), which rolls the whole call back: no read of it before.
        caps: dict[_DayKey, int] = {}
        added: dict[_DayKey, int] = {}
        freed_planned: dict[_DayKey, int] = {}
        freed_sent: dict[_DayKey, int] = {}
        moved: list[_Held] = []
        for booking in todo:
            day = (booking.sender_id, booking.day)
            caps[day] = min(caps.get(day, booking.cap), booking.cap)
            added[day] = added.get(day, 0) + 1
            held = old.get(booking.task_id)
            if held is not None and held.sent:
                raise Overbooked(booking.sender_id, at=booking.at)  # a sent email stays put
            if held is not None:
                moved.append(held)
                freed = freed_sent if held.sent else freed_planned
                key = (held.sender_id, held.day)
                freed[key] = freed.get(key, 0) + 1
        days = sorted(set(added) | set(freed_planned) | set(freed_sent))
        counts = self._locked_days(conn, days, create=sorted(added))
        for day, count in added.items():
            planned, sent = counts[day]
            # As the in-memory store counts: a sent booking moved away frees no room.
            if planned + sent - freed_planned.get(day, 0) + count > caps[day]:
                raise Overbooked(day[0], day=day[1])
        self._delete_rows(conn, [h.task_id for h in moved])
        self._set_days(
            conn,
            {
                day: (
                    counts[day][0] - freed_planned.get(day, 0) + added.get(day, 0),
                    counts[day][1] - freed_sent.get(day, 0),
                )
                for day in days
            },
        )
        self._insert_rows(conn, sorted(todo, key=_slot))
        self._remember_contacts(conn, todo)

    def _book_new(self, conn: Connection, wanted: Sequence[Booking]) -> bool:
        """SQLite's common case, a provisioning chunk: book ``wanted`` as the bookings of tasks
        that hold none, without reading the tasks' bookings first. The slot rows go in under a
        savepoint and are counted; a task that holds a booking already (``task_id`` is unique)
        or a slot another task holds leaves a row out, and then this attempt is undone and
        False sends the caller down the general path, as a day that looks full does (a move
        off it could free room). The caller holds SQLite's write lock throughout."""
        caps: dict[_DayKey, int] = {}
        added: dict[_DayKey, int] = {}
        for b in wanted:
            day = (b.sender_id, b.day)
            caps[day] = min(caps.get(day, b.cap), b.cap)
            added[day] = added.get(day, 0) + 1
        days = sorted(added)
        counts = day_counts(conn, days)
        if any(sum(counts[day]) + added[day] > caps[day] for day in days):
            return False
        values = self._booking_rows(wanted)
        conn.exec_driver_sql("SAVEPOINT sq_new_bookings")
        taken = self._insert_new(conn, _INTO_BOOKINGS, _BOOKING_MARKS, values)
        if taken != len(values):
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT sq_new_bookings")
        conn.exec_driver_sql("RELEASE SAVEPOINT sq_new_bookings")
        if taken != len(values):
            return False
        set_day_counts(conn, {day: (counts[day][0] + added[day], counts[day][1]) for day in days})
        self._remember_contacts(conn, wanted)
        return True

    def _set_days(self, conn: Connection, counts: dict[_DayKey, tuple[int, int]]) -> None:
        """Write each day row's new (planned, sent), in (sender, day) order."""
        conn.execute(
            sa.update(tables.sender_days)
            .where(
                _D.sender_id == sa.bindparam("b_sender_id"),
                _D.day == sa.bindparam("b_day", type_=sa.Date()),
            )
            .values(planned=sa.bindparam("b_planned"), sent=sa.bindparam("b_sent")),
            [
                {"b_sender_id": s, "b_day": d, "b_planned": planned, "b_sent": sent}
                for (s, d), (planned, sent) in sorted(counts.items())
            ],
        )

    def _require_senders(self, conn: Connection, sender_ids: Collection[str]) -> None:
        """NotFound for the first unknown sender; the others' rows held ``FOR KEY SHARE``
        until the transaction ends (so none of them is removed meanwhile)."""
        wanted = sorted(sender_ids)
        if self.dialect == "sqlite":  # no row locks: the writer holds the whole database
            if (missing := missing_sender(conn, wanted)) is not None:
                raise NotFound("sender", missing)
            return
        found: set[str] = set()
        for part in rows.chunks(wanted, _CHUNK):
            query = (
                sa.select(_S.id)
                .where(_S.id.in_(part))
                .order_by(*self._lock_order(_S.id))
                .with_for_update(read=True, key_share=True)
            )
            found.update(conn.execute(query).scalars())
        for sender_id in wanted:
            if sender_id not in found:
                raise NotFound("sender", sender_id)

    def _held(
        self, conn: Connection, task_ids: Sequence[str], *, planned_only: bool
    ) -> dict[str, _Held]:
        """The bookings of ``task_ids`` (sorted), locked ``FOR UPDATE`` in that order."""
        out: dict[str, _Held] = {}
        for part in rows.chunks(task_ids, _CHUNK):
            query = (
                sa.select(_B.task_id, _B.sender_id, _B.at_ms, _B.day, _B.sent)
                .where(_B.task_id.in_(part))
                .order_by(*self._lock_order(_B.task_id))
                .with_for_update()
            )
            if planned_only:
                query = query.where(_B.sent == sa.false())
            for task_id, sender_id, at_ms, day, sent in conn.execute(query):
                out[task_id] = _Held(task_id, sender_id, int(at_ms), day, bool(sent))
        return out

    def _locked_days(
        self, conn: Connection, days: Sequence[_DayKey], *, create: Sequence[_DayKey]
    ) -> dict[_DayKey, tuple[int, int]]:
        """(planned, sent) of each of ``days`` (sorted), their rows locked ``FOR UPDATE`` in
        that order; the rows of ``create`` (sorted) are inserted as zeros first if missing."""
        if create:
            conn.execute(
                self._insert(tables.sender_days).on_conflict_do_nothing(),
                [{"sender_id": s, "day": d, "planned": 0, "sent": 0} for s, d in create],
            )
        counts: dict[_DayKey, tuple[int, int]] = {}
        # One read for every sender's days (row values), locked in (sender, day) order.
        for part in rows.chunks(days, _CHUNK):
            query = (
                sa.select(_D.sender_id, _D.day, _D.planned, _D.sent)
                .where(sa.tuple_(_D.sender_id, _D.day).in_(list(part)))
                .order_by(*self._lock_order(_D.sender_id, _D.day))
                .with_for_update()
            )
            for sender_id, day, planned, sent in conn.execute(query):
                counts[(sender_id, day)] = (int(planned), int(sent))
        for key in days:
            # A day a moved booking leaves always has its row; one the call books was just
            # made. Only a row deleted behind our back (by hand) could be missing.
            counts.setdefault(key, (0, 0))
        return counts

    def _delete_rows(self, conn: Connection, task_ids: Sequence[str]) -> None:
        for part in rows.chunks(sorted(task_ids), _CHUNK):
            conn.execute(sa.delete(tables.sender_bookings).where(_B.task_id.in_(part)))

    def _insert_rows(self, conn: Connection, todo: Sequence[Booking]) -> None:
        """Insert the bookings (in slot order); Overbooked for one a concurrent caller took
        (its slot held by another task, or its task booked by a concurrent caller)."""
        # The driver's executemany of plain tuples, the rows taken counted: SQLAlchemy's
        # per-row parameter processing and RETURNING cost twice the insert itself
        # (docs/performance.md). A shortfall is rare (a race): the refused one is looked up.
        for part in rows.chunks(todo, _CHUNK):
            values = self._booking_rows(part)
            if self._insert_new(conn, _INTO_BOOKINGS, _BOOKING_MARKS, values) != len(part):
                raise self._refused(conn, part)

    def _insert_new(
        self, conn: Connection, into: str, marks: str, values: Sequence[tuple[object, ...]]
    ) -> int:
        """How many of ``values`` ``{into} VALUES {marks} ON CONFLICT DO NOTHING`` took: on
        SQLite many rows per statement (:func:`insert_values`), on PostgreSQL the driver's
        ``executemany`` (which pipelines its rows)."""
        if self.dialect == "sqlite":
            return insert_values(conn, into, marks.format(mark="?"), values)
        statement = f"{into} VALUES {marks.format(mark='%s')} ON CONFLICT DO NOTHING"
        return int(conn.exec_driver_sql(statement, values).rowcount)

    def _booking_rows(self, bookings: Sequence[Booking]) -> list[tuple[object, ...]]:
        """The rows of ``bookings`` for :data:`_INTO_BOOKINGS` (SQLite takes a day as its ISO
        text). A new slot is unsent: FALSE in the statement, as sqlite3 binds a bool through
        its adapter lookup, several times an int's cost."""
        sqlite = self.dialect == "sqlite"
        values: list[tuple[object, ...]] = [
            (
                b.sender_id, b.at_ms, b.task_id, b.campaign_id,
                b.day.isoformat() if sqlite else b.day, b.recipient, b.cap,
            )
            for b in bookings
        ]  # fmt: skip
        return values

    def _refused(self, conn: Connection, part: Sequence[Booking]) -> Overbooked:
        """Overbooked for the first of ``part`` whose row did not go in."""
        query = sa.select(_B.task_id, _B.sender_id, _B.at_ms).where(
            _B.task_id.in_([b.task_id for b in part])
        )
        stored = {task: (sender, int(ms)) for task, sender, ms in conn.execute(query)}
        for booking in part:
            if stored.get(booking.task_id) != _slot(booking):
                return Overbooked(booking.sender_id, at=booking.at)
        # Every row is there: a concurrent caller booked one of these tasks on the same slot.
        return Overbooked(part[0].sender_id, at=part[0].at)

    def _remember_contacts(self, conn: Connection, todo: Iterable[Booking]) -> None:
        """Insert-or-keep each recipient's sender: the first of the call for a new one."""
        first: dict[str, str] = {}
        for booking in todo:
            first.setdefault(booking.recipient, booking.sender_id)
        if first:
            self._insert_new(conn, _INTO_CONTACTS, _CONTACT_MARKS, sorted(first.items()))

    def _count_off(
        self, conn: Connection, held: Iterable[_Held], *, planned: int, sent: int
    ) -> None:
        """Add ``planned`` and ``sent`` (per booking) to the day rows of ``held``, in (sender,
        day) order."""
        per_day: dict[_DayKey, int] = {}
        for h in held:
            per_day[(h.sender_id, h.day)] = per_day.get((h.sender_id, h.day), 0) + 1
        if not per_day:
            return
        conn.execute(
            sa.update(tables.sender_days)
            .where(
                _D.sender_id == sa.bindparam("b_sender_id"),
                _D.day == sa.bindparam("b_day", type_=sa.Date()),
            )
            .values(
                planned=_D.planned + sa.bindparam("b_planned", type_=sa.Integer()),
                sent=_D.sent + sa.bindparam("b_sent", type_=sa.Integer()),
            ),
            [
                {"b_sender_id": s, "b_day": d, "b_planned": planned * n, "b_sent": sent * n}
                for (s, d), n in sorted(per_day.items())
            ],
        )

    def release(self, task_ids: Collection[str]) -> int:
        wanted = sorted(set(task_ids))
        if not wanted:
            return 0
        with self._write("release sender slots") as conn:
            held = self._held(conn, wanted, planned_only=True)
            if not held:
                return 0
            self._delete_rows(conn, list(held))
            self._count_off(conn, held.values(), planned=-1, sent=0)
        return len(held)

    def mark_sent(self, task_id: str) -> bool:
        with self._write("count a sent booking") as conn:
            found = conn.execute(
                sa.update(tables.sender_bookings)
                .where(_B.task_id == task_id, _B.sent == sa.false())
                .values(sent=True)
                .returning(_B.sender_id, _B.at_ms, _B.day)
            ).first()
            if found is None:
                return False
            sender_id, at_ms, day = found
            held = _Held(task_id, sender_id, int(at_ms), day, True)
            self._count_off(conn, [held], planned=-1, sent=1)
        return True

    def booking_of(self, task_id: str) -> Booking | None:
        query = sa.select(
            _B.sender_id, _B.at_ms, _B.day, _B.task_id, _B.campaign_id, _B.recipient, _B.cap
        ).where(_B.task_id == task_id)
        with self._read("read a booking") as conn:
            found = conn.execute(query).first()
        if found is None:
            return None
        sender_id, at_ms, day, task, campaign_id, recipient, cap = found
        return Booking(
            sender_id=sender_id,
            at=_instant(int(at_ms)),
            day=day,
            task_id=task,
            campaign_id=campaign_id,
            recipient=recipient,
            cap=int(cap),
        )

    def booked_times(self, sender_id: str, *, since: datetime, until: datetime) -> list[datetime]:
        low, high = epoch_ms(utc(since)), epoch_ms(utc(until))
        query = (
            sa.select(_B.at_ms)
            .where(_B.sender_id == sender_id, _B.at_ms >= low, _B.at_ms < high)
            .order_by(_B.at_ms)
        )
        with self._read("read booked times") as conn:
            return [_instant(int(ms)) for ms in conn.execute(query).scalars()]

    def sender_usage(self, sender_id: str, *, since: date, until: date) -> list[SenderDay]:
        query = (
            sa.select(_D.day, _D.planned, _D.sent)
            .where(
                _D.sender_id == sender_id,
                _D.day >= since,
                _D.day < until,
                _D.planned + _D.sent > 0,
            )
            .order_by(_D.day)
        )
        with self._read("read sender usage") as conn:
            return [SenderDay(day, int(p), int(s)) for day, p, s in conn.execute(query)]

    def sending_days(self, sender_id: str, *, since: date) -> list[date]:
        # A day row stays when its bookings go (at zero counts), and goes in only with a
        # booking: a refused call rolls its rows back.
        query = sa.select(_D.day).where(_D.sender_id == sender_id, _D.day >= since).order_by(_D.day)
        with self._read("read sending days") as conn:
            return list(conn.execute(query).scalars())

    def sticky_senders(self, recipients: Collection[str]) -> dict[str, str]:
        wanted = sorted(set(recipients))
        return self._sticky_rows(wanted) if wanted else {}

    def _sticky_rows(self, recipients: Sequence[str]) -> dict[str, str]:
        """:meth:`sticky_senders` of distinct ``recipients`` (at least one)."""
        out: dict[str, str] = {}
        with self._read("read sticky senders") as conn:
            for part in rows.chunks(recipients, _CHUNK):
                query = sa.select(_C.recipient, _C.sender_id).where(_C.recipient.in_(part))
                out.update((r, s) for r, s in conn.execute(query))
        return out


def _slot(booking: Booking) -> _SlotKey:
    return (booking.sender_id, booking.at_ms)
