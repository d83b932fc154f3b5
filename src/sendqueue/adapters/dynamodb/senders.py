"""Senders and their bookings in the DynamoDB table (:class:`SenderItems`, a base of
:class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`); the port's contract is
:class:`~sendqueue.ports.SenderStore`.

Items (the table's key layout is in :mod:`~sendqueue.adapters.dynamodb.table`):

- ``sender`` / id: a sender (``d`` the sender as JSON, transport as given); ``senderaddr`` /
  its address lower-cased: the claim that keeps an address to one sender (``sid``). Both are
  written in one transaction, each ``attribute_not_exists``; ``update_sender`` moves the claim
  in a transaction when the address changes. ``list_senders`` queries the ``sender``
  partition.
- ``SL#<sender>`` / the slot's epoch milliseconds (15 digits): a slot, held by one task
  (``task``, ``at``, ``day``, ``cid``, ``rc``, ``cap``, ``sent``). Put with
  ``attribute_not_exists``, so two tasks cannot hold one slot; ``booked_times`` is a query of
  the partition's sort-key range.
- ``SD#<sender>`` / ISO day: a sender's local day: ``planned``, ``sent`` and ``total`` (their
  sum, kept because a condition cannot add). A booking adds to it under the condition
  ``attribute_not_exists(total) OR total <= cap - added + freed`` (the call's own bookings of
  that day, and its moves off that day): a full day refuses the write. ``sender_usage`` queries
  the partition's range.
- ``BK#<task>`` / ``#``: the task's booking (the slot's attributes, ``v`` a version that every
  write of it bumps and is conditional on, and ``fr``, frees still to be made, see below).
  ``booking_of``, ``release`` and ``mark_sent`` start from one consistent read of it.
- ``ST#<recipient>`` / ``#``: the first sender a recipient was booked on (``sid``), put with
  ``attribute_not_exists`` after the booking committed (the first one wins).

``book`` reads the call's task pointers (BatchGetItem, consistent), checks what it can without
writing (two bookings of one slot, a slot the call's own tasks hold, a day the call alone
overfills), and then writes. A call that fits one TransactWriteItems (100 items: two per
booking, three per move, one per day touched) is one transaction, all or nothing: new slots,
pointers (conditional on their version), freed old slots and the day counts (one update per
day, netted). A larger call is written in two phases so that it can be undone without ever
giving back what someone else may have taken meanwhile:

1. Transactions of up to 100 items put the new slots, the pointers (recording the old slot in
   ``fr``) and the day additions. Old slots stay held and counted, and every day's condition
   credits the moves off it (``freed``), so the checks are the one-transaction checks. A
   refused transaction (slot or day) undoes the ones before it (deletes their slots, restores
   their pointers, subtracts their additions) and raises :class:`Overbooked`.
2. Then the old slots are freed and ``fr`` is cleared, also in transactions. Nothing can refuse
   these; a process that dies before them leaves moved tasks holding their old slot as well
   (counted, never overbooked), which the next ``book``, ``release`` or ``mark_sent`` of that
   task frees first.

A condition that fails on a pointer means another process changed that task's booking: the
call (having undone what it wrote) reads again and retries. A cancelled transaction's
``CancellationReasons`` name the failed items; a transaction conflict or throttling is retried
with jitter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.client import TableClient, error_code
from sendqueue.adapters.dynamodb.codec import dumps, num_attr, parse_time, str_attr, time_key
from sendqueue.adapters.dynamodb.table import ATTEMPTS, RETRYABLE, TXN_ITEMS, WRITERS
from sendqueue.domain.errors import Conflict, InvalidField, NotFound, Overbooked, StoreUnavailable
from sendqueue.domain.models import utc
from sendqueue.domain.senders import Booking, Sender, SenderDay, epoch_ms

__all__ = ["SenderItems"]

_SENDERS = "sender"
_ADDRESSES = "senderaddr"
_ONE = "#"
#: Attribute names that DynamoDB may take for keywords, always given as placeholders.
_NAMES = {"#p": "planned", "#s": "sent", "#t": "total"}

#: A sender's local day: (sender id, day).
_DayKey = tuple[str, date]


def _slot_pk(sender_id: str) -> str:
    return f"SL#{sender_id}"


def _slot_sk(ms: int) -> str:
    return f"{ms:015d}"


def _day_pk(sender_id: str) -> str:
    return f"SD#{sender_id}"


def _pointer_pk(task_id: str) -> str:
    return f"BK#{task_id}"


def _sticky_pk(recipient: str) -> str:
    return f"ST#{recipient}"


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": str_attr(pk), "sk": str_attr(sk)}


# -- senders ---------------------------------------------------------------------------------


def _sender_doc(sender: Sender) -> str:
    return dumps(
        {
            "id": sender.id,
            "email": sender.email,
            "name": sender.name,
            "reply_to": sender.reply_to,
            "transport": sender.transport,
            "daily_cap": sender.daily_cap,
            "min_gap_seconds": sender.min_gap_seconds,
            "timezone": sender.timezone,
            "warmup_start": sender.warmup_start,
            "warmup_step": sender.warmup_step,
            "warmup_from": None if sender.warmup_from is None else sender.warmup_from.isoformat(),
        }
    )


def _sender_item(sender: Sender) -> dict[str, Any]:
    return {
        **_key(_SENDERS, sender.id),
        "em": str_attr(sender.email.lower()),
        "d": str_attr(_sender_doc(sender)),
    }


def _sender_from(item: Mapping[str, Any]) -> Sender:
    doc = json.loads(item["d"]["S"])
    start = doc.get("warmup_from")
    return Sender(
        id=doc["id"],
        email=doc["email"],
        name=doc.get("name", ""),
        reply_to=doc.get("reply_to"),
        transport=doc.get("transport"),
        daily_cap=doc["daily_cap"],
        min_gap_seconds=doc["min_gap_seconds"],
        timezone=doc["timezone"],
        warmup_start=doc.get("warmup_start"),
        warmup_step=doc.get("warmup_step"),
        warmup_from=None if start is None else date.fromisoformat(start),
    )


def _claim_item(sender: Sender) -> dict[str, Any]:
    return {**_key(_ADDRESSES, sender.email.lower()), "sid": str_attr(sender.id)}


# -- bookings --------------------------------------------------------------------------------


def _booking_attrs(booking: Booking, *, sent: bool) -> dict[str, Any]:
    return {
        "sid": str_attr(booking.sender_id),
        "at": str_attr(time_key(booking.at)),
        "ms": num_attr(booking.at_ms),
        "day": str_attr(booking.day.isoformat()),
        "task": str_attr(booking.task_id),
        "cid": str_attr(booking.campaign_id),
        "rc": str_attr(booking.recipient),
        "cap": num_attr(booking.cap),
        "sent": {"BOOL": sent},
    }


def _booking_from(item: Mapping[str, Any]) -> Booking:
    return Booking(
        sender_id=str(item["sid"]["S"]),
        at=parse_time(item["at"]["S"]),
        day=date.fromisoformat(item["day"]["S"]),
        task_id=str(item["task"]["S"]),
        campaign_id=str(item["cid"]["S"]),
        recipient=str(item["rc"]["S"]),
        cap=int(item["cap"]["N"]),
    )


def _slot_key(booking: Booking) -> dict[str, Any]:
    return _key(_slot_pk(booking.sender_id), _slot_sk(booking.at_ms))


@dataclass(frozen=True)
class _Free:
    """An old slot a task still holds after it moved (phase 2 frees it)."""

    sender_id: str
    ms: int
    day: date
    sent: bool

    def as_json(self) -> list[object]:
        return [self.sender_id, self.ms, self.day.isoformat(), self.sent]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> _Free:
        return cls(str(raw[0]), int(raw[1]), date.fromisoformat(str(raw[2])), bool(raw[3]))


@dataclass(frozen=True)
class _Held:
    """A task's pointer as read: its booking, whether sent, its version and pending frees."""

    item: dict[str, Any]
    booking: Booking
    sent: bool
    version: int
    frees: tuple[_Free, ...]

    @classmethod
    def of(cls, item: dict[str, Any]) -> _Held:
        raw = item.get("fr")
        frees = () if raw is None else tuple(_Free.from_json(f) for f in json.loads(raw["S"]))
        return cls(
            item, _booking_from(item), bool(item["sent"]["BOOL"]), int(item["v"]["N"]), frees
        )

    @property
    def free(self) -> _Free:
        """This booking, as a free to make once the task moved off it."""
        b = self.booking
        return _Free(b.sender_id, b.at_ms, b.day, self.sent)


def _pointer_item(
    booking: Booking, *, sent: bool, version: int, frees: Sequence[_Free] = ()
) -> dict[str, Any]:
    item = {
        **_key(_pointer_pk(booking.task_id), _ONE),
        **_booking_attrs(booking, sent=sent),
        "v": num_attr(version),
    }
    if frees:
        item["fr"] = str_attr(dumps([f.as_json() for f in frees]))
    return item


def _next_version(held: _Held | None) -> int:
    return 1 if held is None else held.version + 1


def _version_condition(held: _Held | None) -> dict[str, Any]:
    """The condition that a pointer is still the one read (or still absent)."""
    if held is None:
        return {"ConditionExpression": "attribute_not_exists(pk)"}
    return {
        "ConditionExpression": "v = :v",
        "ExpressionAttributeValues": {":v": num_attr(held.version)},
    }


@dataclass
class _Delta:
    """What a transaction adds to one sender day, and how many bookings it adds there."""

    planned: int = 0
    sent: int = 0
    added: int = 0


@dataclass
class _Txn:
    """One TransactWriteItems being built: items tagged with what they are, and day deltas
    merged per day (a transaction may not touch one item twice)."""

    table: str
    items: list[dict[str, Any]] = field(default_factory=list)
    tags: list[tuple[str, object]] = field(default_factory=list)
    days: dict[_DayKey, _Delta] = field(default_factory=dict)
    moves: list[_Move] = field(default_factory=list)

    def add(self, tag: str, what: object, item: dict[str, Any]) -> None:
        self.items.append(item)
        self.tags.append((tag, what))

    def day(self, key: _DayKey, *, planned: int = 0, sent: int = 0, added: int = 0) -> None:
        delta = self.days.setdefault(key, _Delta())
        delta.planned += planned
        delta.sent += sent
        delta.added += added

    def size(self) -> int:
        return len(self.items) + len(self.days)

    def build(
        self, plan: _Plan | None = None
    ) -> tuple[list[dict[str, Any]], list[tuple[str, object]]]:
        """The items and their tags, with one update per day. A day this transaction adds
        bookings to is conditional on room for them: ``total <= cap - added + freed``, where
        ``freed`` counts the call's moves off that day (their old bookings are still counted
        in ``total`` when the condition is evaluated)."""
        items, tags = list(self.items), list(self.tags)
        for key, delta in self.days.items():
            counts = {"#p": delta.planned, "#s": delta.sent, "#t": delta.planned + delta.sent}
            adds = {name: n for name, n in counts.items() if n}
            op: dict[str, Any] = {
                "TableName": self.table,
                "Key": _key(_day_pk(key[0]), key[1].isoformat()),
            }
            names = {name: _NAMES[name] for name in adds}
            values = {f":{name[1:]}": num_attr(n) for name, n in adds.items()}
            if delta.added and plan is not None:
                limit = plan.caps[key] - delta.added + plan.credit.get(key, 0)
                op["ConditionExpression"] = "attribute_not_exists(#t) OR #t <= :limit"
                names["#t"] = _NAMES["#t"]
                values[":limit"] = num_attr(limit)
            elif not adds:
                continue
            op["ExpressionAttributeNames"] = names
            op["ExpressionAttributeValues"] = values
            if adds:
                op["UpdateExpression"] = "ADD " + ", ".join(f"{n} :{n[1:]}" for n in adds)
                items.append({"Update": op})
            else:
                items.append({"ConditionCheck": op})  # a move within a day: no count changes
            tags.append(("day", key))
        return items, tags


@dataclass(frozen=True)
class _Move:
    """One booking of a call, and the task's booking before it (None: a new one)."""

    booking: Booking
    old: _Held | None


@dataclass
class _Plan:
    moves: list[_Move]
    caps: dict[_DayKey, int]
    credit: dict[_DayKey, int]


class _Raced(Exception):
    """Another process changed a task's booking between our read and our write."""


class SenderItems(TableClient):
    """:class:`~sendqueue.ports.SenderStore` in the store's table (see the module docstring)."""

    # -- senders -----------------------------------------------------------------------------
    def add_sender(self, sender: Sender) -> None:
        new = "attribute_not_exists(pk)"
        items = [
            {
                "Put": {
                    "TableName": self._table,
                    "Item": _sender_item(sender),
                    "ConditionExpression": new,
                }
            },
            {
                "Put": {
                    "TableName": self._table,
                    "Item": _claim_item(sender),
                    "ConditionExpression": new,
                }
            },
        ]
        with self._errors("add a sender"):
            failed = self._commit(items)
        if 0 in failed:
            raise Conflict(f"sender {sender.id} exists")
        if failed:
            raise Conflict(f"the address {sender.email} belongs to another sender")

    def get_sender(self, sender_id: str) -> Sender:
        with self._errors("read a sender"):
            item = self._get(_SENDERS, sender_id)
        if item is None:
            raise NotFound("sender", sender_id)
        return _sender_from(item)

    def list_senders(self) -> list[Sender]:
        with self._errors("list senders"):
            items = list(
                self._query(
                    KeyConditionExpression="pk = :pk",
                    ExpressionAttributeValues={":pk": str_attr(_SENDERS)},
                    ConsistentRead=True,
                )
            )
        return sorted((_sender_from(i) for i in items), key=lambda s: (s.email.lower(), s.id))

    def update_sender(self, sender: Sender) -> None:
        claim_gone = False  # the old address's claim was missing: nothing to delete
        with self._errors("update a sender"):
            for attempt in range(ATTEMPTS):
                current = self._get(_SENDERS, sender.id)
                if current is None:
                    raise NotFound("sender", sender.id)
                items: list[dict[str, Any]] = [
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": _sender_item(sender),
                            "ConditionExpression": "d = :d",
                            "ExpressionAttributeValues": {":d": current["d"]},
                        }
                    }
                ]
                old_address = str(current["em"]["S"])
                if old_address != sender.email.lower():
                    mine = {":sid": str_attr(sender.id)}
                    items.append(
                        {
                            "Put": {
                                "TableName": self._table,
                                "Item": _claim_item(sender),
                                "ConditionExpression": "attribute_not_exists(pk) OR sid = :sid",
                                "ExpressionAttributeValues": mine,
                            }
                        }
                    )
                    if not claim_gone:
                        items.append(
                            {
                                "Delete": {
                                    "TableName": self._table,
                                    "Key": _key(_ADDRESSES, old_address),
                                    "ConditionExpression": "sid = :sid",
                                    "ExpressionAttributeValues": mine,
                                }
                            }
                        )
                failed = self._commit(items)
                if not failed:
                    return
                if 1 in failed:
                    raise Conflict(f"the address {sender.email} belongs to another sender")
                claim_gone = claim_gone or 2 in failed
                if 0 in failed:
                    self._backoff(attempt)  # the sender changed meanwhile: read it again
        raise StoreUnavailable("DynamoDB: updating a sender kept losing races")

    def remove_sender(self, sender_id: str) -> None:
        with self._errors("remove a sender"):
            current = self._get(_SENDERS, sender_id)
            if current is None:
                raise NotFound("sender", sender_id)
            planned = self._count(
                KeyConditionExpression="pk = :pk",
                FilterExpression="#s = :no",
                ExpressionAttributeNames={"#s": "sent"},
                ExpressionAttributeValues={
                    ":pk": str_attr(_slot_pk(sender_id)),
                    ":no": {"BOOL": False},
                },
                ConsistentRead=True,
            )
            if planned:
                raise Conflict(
                    f"sender {sender_id} has {planned} planned sends; cancel or re-plan them first"
                )
            failed = self._commit(
                [
                    {
                        "Delete": {
                            "TableName": self._table,
                            "Key": _key(_SENDERS, sender_id),
                            "ConditionExpression": "attribute_exists(pk)",
                        }
                    },
                    {
                        "Delete": {
                            "TableName": self._table,
                            "Key": _key(_ADDRESSES, str(current["em"]["S"])),
                            "ConditionExpression": "sid = :sid",
                            "ExpressionAttributeValues": {":sid": str_attr(sender_id)},
                        }
                    },
                ]
            )
            if 0 in failed:
                raise NotFound("sender", sender_id)  # removed meanwhile
            self._drop_bookings_of(sender_id)

    def _drop_bookings_of(self, sender_id: str) -> None:
        """Delete a removed sender's (sent) slots, the pointers still on them, and its days."""
        slots = list(
            self._query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": str_attr(_slot_pk(sender_id))},
                ProjectionExpression="pk, sk, task, ms",
                ConsistentRead=True,
            )
        )
        days = list(
            self._query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": str_attr(_day_pk(sender_id))},
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        )

        def drop_pointer(slot: dict[str, Any]) -> None:
            try:
                self._db.delete_item(
                    TableName=self._table,
                    Key=_key(_pointer_pk(str(slot["task"]["S"])), _ONE),
                    ConditionExpression="sid = :sid AND ms = :ms",
                    ExpressionAttributeValues={":sid": str_attr(sender_id), ":ms": slot["ms"]},
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise  # else: the task moved on (its old slot goes below all the same)

        with ThreadPoolExecutor(WRITERS) as pool:
            for _ in pool.map(drop_pointer, slots):
                pass
        deletes = [
            {"DeleteRequest": {"Key": {"pk": item["pk"], "sk": item["sk"]}}}
            for item in slots + days
        ]
        for start in range(0, len(deletes), 25):
            self._batch_write(deletes[start : start + 25])

    # -- booking -----------------------------------------------------------------------------
    def book(self, bookings: Sequence[Booking]) -> None:
        wanted: dict[str, Booking] = {}
        for booking in bookings:
            if booking.at_ms < 0:
                raise InvalidField("at", booking.at, "a booking must be after 1970-01-01")
            wanted.pop(booking.task_id, None)  # a task booked twice in one call: the last one
            wanted[booking.task_id] = booking
        if not wanted:
            return
        with self._errors("book sends"):
            for attempt in range(ATTEMPTS):
                plan = _plan(list(wanted.values()), self._pointers(list(wanted)))
                try:
                    self._write_plan(plan)
                    break
                except _Raced:
                    self._backoff(attempt)  # a task's booking changed: read again
            else:
                raise StoreUnavailable("DynamoDB: a booking kept losing races")
            self._stick(wanted.values())

    def _write_plan(self, plan: _Plan) -> None:
        """Write the plan: one transaction when it fits, else the two phases (module
        docstring). Raises Overbooked or _Raced, having undone what it wrote."""
        if not plan.moves:
            return
        whole = _Txn(self._table)
        for move in plan.moves:
            self._add_move(whole, move, free_now=True)
        if whole.size() <= TXN_ITEMS:
            self._commit_booking(whole, plan)
            return
        # Phase 1, grouped by day so that a transaction touches few day items.
        chunks = [_Txn(self._table)]
        for move in sorted(plan.moves, key=lambda m: (m.booking.sender_id, m.booking.day)):
            new_day = (move.booking.sender_id, move.booking.day)
            if chunks[-1].size() + 2 + (new_day not in chunks[-1].days) > TXN_ITEMS:
                chunks.append(_Txn(self._table))
            self._add_move(chunks[-1], move, free_now=False)
        done: list[_Txn] = []
        try:
            for chunk in chunks:
                self._commit_booking(chunk, plan)
                done.append(chunk)
        except (Overbooked, _Raced):
            self._undo(done)
            raise
        # Phase 2: the moved tasks' old slots.
        self._finish_frees([m.booking.task_id for m in plan.moves if m.old is not None])

    def _add_move(self, txn: _Txn, move: _Move, *, free_now: bool) -> None:
        """Book ``move`` in ``txn``: its slot, its pointer, its day; and free its old slot now
        (one transaction) or record it in the pointer for phase 2."""
        b, old = move.booking, move.old
        txn.moves.append(move)
        txn.add(
            "slot",
            b,
            {
                "Put": {
                    "TableName": self._table,
                    "Item": {**_slot_key(b), **_booking_attrs(b, sent=False)},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
        )
        frees = () if old is None or free_now else (old.free,)
        pointer = _pointer_item(b, sent=False, version=_next_version(old), frees=frees)
        txn.add(
            "pointer",
            b.task_id,
            {"Put": {"TableName": self._table, "Item": pointer, **_version_condition(old)}},
        )
        txn.day((b.sender_id, b.day), planned=1, added=1)
        if old is not None and free_now:
            self._add_free(txn, b.task_id, old.free)

    def _add_free(self, txn: _Txn, task_id: str, free: _Free) -> None:
        """Free a slot ``task_id`` holds: delete it (while the task holds it), and take it off
        its day's count."""
        txn.add(
            "free",
            (task_id, free),
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": _key(_slot_pk(free.sender_id), _slot_sk(free.ms)),
                    "ConditionExpression": "task = :t",
                    "ExpressionAttributeValues": {":t": str_attr(task_id)},
                }
            },
        )
        if free.sent:
            txn.day((free.sender_id, free.day), sent=-1)
        else:
            txn.day((free.sender_id, free.day), planned=-1)

    def _commit_booking(self, txn: _Txn, plan: _Plan) -> None:
        """Commit a booking transaction, or raise _Raced (a pointer or an old slot changed),
        else Overbooked (for a taken slot before a full day)."""
        items, tags = txn.build(plan)
        failed = [tags[i] for i in self._commit(items)]
        if not failed:
            return
        if any(tag in ("pointer", "free") for tag, _ in failed):
            raise _Raced
        for tag, what in failed:
            if tag == "slot" and isinstance(what, Booking):
                raise Overbooked(what.sender_id, at=what.at)
        for tag, what in failed:
            if tag == "day" and isinstance(what, tuple):
                raise Overbooked(what[0], day=what[1])
        raise _Raced  # not reached: every item is tagged

    def _undo(self, done: Sequence[_Txn]) -> None:
        """Take back committed phase-1 transactions: delete their slots, put their pointers
        back as read, subtract their day additions (old slots were never freed, so nothing
        has to be taken back from anyone). A task whose pointer changed since (another process
        moved, released or sent it) is left to that process, which freed what it had to."""
        for txn in reversed(done):
            moves = list(txn.moves)
            for attempt in range(ATTEMPTS):
                if not moves:
                    break
                undo = _Txn(self._table)
                for move in moves:
                    self._add_unbook(undo, move)
                items, tags = undo.build()
                failed = [tags[i] for i in self._commit(items)]
                if not failed:
                    break
                gone = {what for tag, what in failed if tag == "pointer"}
                gone |= {w.task_id for tag, w in failed if tag == "slot" and isinstance(w, Booking)}
                moves = [m for m in moves if m.booking.task_id not in gone]
                self._backoff(attempt)
            else:
                raise StoreUnavailable("DynamoDB: undoing a refused booking kept losing races")

    def _add_unbook(self, txn: _Txn, move: _Move) -> None:
        b, old = move.booking, move.old
        txn.add(
            "slot",
            b,
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": _slot_key(b),
                    "ConditionExpression": "task = :t",
                    "ExpressionAttributeValues": {":t": str_attr(b.task_id)},
                }
            },
        )
        written = {
            "ConditionExpression": "v = :v",
            "ExpressionAttributeValues": {":v": num_attr(_next_version(old))},
        }
        key = _key(_pointer_pk(b.task_id), _ONE)
        if old is None:
            op: dict[str, Any] = {"Delete": {"TableName": self._table, "Key": key, **written}}
        else:
            op = {"Put": {"TableName": self._table, "Item": old.item, **written}}
        txn.add("pointer", b.task_id, op)
        txn.day((b.sender_id, b.day), planned=-1)

    # -- release, sent -----------------------------------------------------------------------
    def release(self, task_ids: Collection[str]) -> int:
        todo = sorted(set(task_ids))
        freed = 0
        with self._errors("release bookings"):
            for attempt in range(ATTEMPTS):
                if not todo:
                    return freed
                held = {t: h for t, h in self._pointers(todo).items() if not h.sent}
                todo = [t for t in todo if t in held]
                raced: list[str] = []
                for start in range(0, len(todo), (TXN_ITEMS - 1) // 3):
                    chunk = todo[start : start + (TXN_ITEMS - 1) // 3]
                    txn = _Txn(self._table)
                    for task in chunk:
                        self._add_release(txn, held[task])
                    items, _tags = txn.build()
                    if self._commit(items):
                        raced += chunk  # one of them changed: read them again
                    else:
                        freed += len(chunk)
                todo = raced
                if todo:
                    self._backoff(attempt)
        raise StoreUnavailable("DynamoDB: releasing bookings kept losing races")

    def _add_release(self, txn: _Txn, held: _Held) -> None:
        b = held.booking
        txn.add(
            "pointer",
            b.task_id,
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": _key(_pointer_pk(b.task_id), _ONE),
                    **_version_condition(held),
                }
            },
        )
        self._add_free(txn, b.task_id, held.free)

    def mark_sent(self, task_id: str) -> bool:
        with self._errors("count a send"):
            for attempt in range(ATTEMPTS):
                held = self._pointers([task_id]).get(task_id)
                if held is None or held.sent:
                    return False
                b = held.booking
                txn = _Txn(self._table)
                txn.add(
                    "pointer",
                    task_id,
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": _pointer_item(b, sent=True, version=_next_version(held)),
                            **_version_condition(held),
                        }
                    },
                )
                txn.add(
                    "slot",
                    b,
                    {
                        "Update": {
                            "TableName": self._table,
                            "Key": _slot_key(b),
                            "UpdateExpression": "SET #s = :yes",
                            "ConditionExpression": "task = :t",
                            "ExpressionAttributeNames": {"#s": "sent"},
                            "ExpressionAttributeValues": {
                                ":yes": {"BOOL": True},
                                ":t": str_attr(task_id),
                            },
                        }
                    },
                )
                txn.day((b.sender_id, b.day), planned=-1, sent=1)
                items, _tags = txn.build()
                if not self._commit(items):
                    return True
                self._backoff(attempt)
        raise StoreUnavailable("DynamoDB: counting a send kept losing races")

    # -- pointers and frees ------------------------------------------------------------------
    def _pointers(self, task_ids: Sequence[str]) -> dict[str, _Held]:
        """The tasks' pointers, read consistently, with no frees pending (made first)."""
        for attempt in range(ATTEMPTS):
            items = self._batch_get([(_pointer_pk(t), _ONE) for t in task_ids])
            held = {h.booking.task_id: h for h in map(_Held.of, items)}
            pending = [h for h in held.values() if h.frees]
            if not pending:
                return held
            self._make_frees(pending)
            if attempt:
                self._backoff(attempt)
        raise StoreUnavailable("DynamoDB: freeing moved bookings kept losing races")

    def _finish_frees(self, task_ids: Sequence[str]) -> None:
        """Phase 2 of a large booking: free the old slots the tasks' pointers still name."""
        self._pointers(task_ids)

    def _make_frees(self, pending: Sequence[_Held]) -> None:
        """Free what the pointers of ``pending`` record, in transactions: per task its old
        slots, their day counts, and the pointer without ``fr`` (conditional on its version).
        A slot the task no longer holds (a removed sender's) is skipped. Returns early when a
        pointer changed: the caller reads again."""
        skip: set[tuple[str, _Free]] = set()
        todo = list(pending)
        while todo:
            txn = _Txn(self._table)
            chunk: list[_Held] = []
            for held in todo:
                if chunk and txn.size() + 1 + 2 * len(held.frees) > TXN_ITEMS:
                    break
                chunk.append(held)
                pointer = _pointer_item(held.booking, sent=held.sent, version=_next_version(held))
                txn.add(
                    "pointer",
                    held.booking.task_id,
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": pointer,
                            **_version_condition(held),
                        }
                    },
                )
                for free in held.frees:
                    if (held.booking.task_id, free) not in skip:
                        self._add_free(txn, held.booking.task_id, free)
            items, tags = txn.build()
            failed = [tags[i] for i in self._commit(items)]
            gone = {w for tag, w in failed if tag == "free" and isinstance(w, tuple)} - skip
            if not failed:
                todo = todo[len(chunk) :]
            elif any(tag == "pointer" for tag, _ in failed) or not gone:
                return
            else:
                skip |= gone  # try the chunk again without them

    # -- reads -------------------------------------------------------------------------------
    def booking_of(self, task_id: str) -> Booking | None:
        with self._errors("read a booking"):
            item = self._get(_pointer_pk(task_id), _ONE)
        return None if item is None else _booking_from(item)

    def booked_times(self, sender_id: str, *, since: datetime, until: datetime) -> list[datetime]:
        low, high = max(epoch_ms(utc(since)), 0), epoch_ms(utc(until))
        if high <= low:
            return []
        with self._errors("read a sender's booked times"):
            return [
                parse_time(item["at"]["S"])
                for item in self._query(
                    KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                    ExpressionAttributeValues={
                        ":pk": str_attr(_slot_pk(sender_id)),
                        ":low": str_attr(_slot_sk(low)),
                        ":high": str_attr(_slot_sk(high - 1)),
                    },
                    ProjectionExpression="#a",
                    ExpressionAttributeNames={"#a": "at"},
                    ConsistentRead=True,
                )
            ]

    def sender_usage(self, sender_id: str, *, since: date, until: date) -> list[SenderDay]:
        if until <= since:
            return []
        last = until - timedelta(days=1)
        with self._errors("read a sender's usage"):
            items = list(
                self._query(
                    KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                    ExpressionAttributeValues={
                        ":pk": str_attr(_day_pk(sender_id)),
                        ":low": str_attr(since.isoformat()),
                        ":high": str_attr(last.isoformat()),
                    },
                    ConsistentRead=True,
                )
            )
        out = []
        for item in items:
            planned = int(item.get("planned", {"N": "0"})["N"])
            sent = int(item.get("sent", {"N": "0"})["N"])
            if planned + sent:
                out.append(SenderDay(date.fromisoformat(item["sk"]["S"]), planned, sent))
        return out

    # -- sticky senders ----------------------------------------------------------------------
    def sticky_senders(self, recipients: Collection[str]) -> dict[str, str]:
        keys = [(_sticky_pk(r), _ONE) for r in sorted(set(recipients))]
        with self._errors("read sticky senders"):
            items = self._batch_get(keys)
        return {str(i["pk"]["S"])[len("ST#") :]: str(i["sid"]["S"]) for i in items}

    def _stick(self, bookings: Iterable[Booking]) -> None:
        """Remember each recipient's first sender (after the booking committed: a refused
        booking leaves none). Conditional puts: of two concurrent first bookings one wins."""
        first: dict[str, str] = {}
        for b in bookings:
            first.setdefault(b.recipient, b.sender_id)
        known = self.sticky_senders(first)
        new = [(r, sid) for r, sid in first.items() if r not in known]

        def put(entry: tuple[str, str]) -> None:
            recipient, sender_id = entry
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item={**_key(_sticky_pk(recipient), _ONE), "sid": str_attr(sender_id)},
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise  # else another booking was first

        if len(new) <= 1:
            for entry in new:
                put(entry)
            return
        with ThreadPoolExecutor(WRITERS) as pool:
            for _ in pool.map(put, new):
                pass

    # -- plumbing ----------------------------------------------------------------------------
    def _commit(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Write ``items`` in one TransactWriteItems: [] once committed, else the indexes of
        the items whose conditions failed (nothing was written). Conflicts with other
        transactions and throttling are retried with jitter."""
        for attempt in range(ATTEMPTS):
            try:
                self._db.transact_write_items(
                    TransactItems=list(items),  # type: ignore[arg-type]
                    ClientRequestToken=uuid.uuid4().hex,
                )
                return []
            except ClientError as exc:
                code = error_code(exc)
                if code == "TransactionCanceledException":
                    reasons = exc.response.get("CancellationReasons") or []
                    codes = [str(r.get("Code", "None")) for r in reasons]
                    failed = [i for i, c in enumerate(codes) if c == "ConditionalCheckFailed"]
                    if failed:
                        return failed
                    if not all(c in RETRYABLE for c in codes):
                        raise
                elif code not in ("TransactionConflictException", "TransactionInProgressException"):
                    raise
            self._backoff(attempt)
        raise StoreUnavailable("DynamoDB: a transaction kept conflicting with others")


def _plan(bookings: Sequence[Booking], held: Mapping[str, _Held]) -> _Plan:
    """What a call books, checked as far as it can be without writing (as the in-memory store
    checks it): raises Overbooked for a slot twice in the call, a slot one of the call's tasks
    holds, or a day the call alone overfills."""
    caps: dict[_DayKey, int] = {}
    added: dict[_DayKey, int] = {}
    credit: dict[_DayKey, int] = {}
    held_slots = {(h.booking.sender_id, h.booking.at_ms) for h in held.values()}
    claimed: set[tuple[str, int]] = set()
    moves: list[_Move] = []
    for b in bookings:
        old = held.get(b.task_id)
        key = (b.sender_id, b.at_ms)
        if old is not None and (old.booking.sender_id, old.booking.at_ms) == key:
            continue  # booked there already: nothing changes
        if old is not None and old.sent:
            raise Overbooked(b.sender_id, at=b.at)  # a sent email stays put
        if key in claimed or key in held_slots:
            raise Overbooked(b.sender_id, at=b.at)
        claimed.add(key)
        day = (b.sender_id, b.day)
        caps[day] = min(caps.get(day, b.cap), b.cap)
        added[day] = added.get(day, 0) + 1
        if old is not None and not old.sent:
            old_day = (old.booking.sender_id, old.booking.day)
            credit[old_day] = credit.get(old_day, 0) + 1
        moves.append(_Move(b, old))
    for day, count in added.items():
        if count - credit.get(day, 0) > caps[day]:
            raise Overbooked(day[0], day=day[1])
    return _Plan(moves, caps, credit)
