"""The DynamoDB items of sender bookings, and the transactions that write them: the pieces
:class:`~sendqueue.adapters.dynamodb.bookings.BookingItems` puts together (keys, codecs, one
TransactWriteItems being built, and the check of a call before it writes). No I/O here.

The item layout and the booking algorithm: :mod:`sendqueue.adapters.dynamodb.bookings`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from sendqueue.adapters.dynamodb.codec import dumps, num_attr, parse_time, str_attr, time_key
from sendqueue.domain.errors import Overbooked
from sendqueue.domain.senders import Booking

__all__ = [
    "ONE",
    "DayKey",
    "Free",
    "Held",
    "Move",
    "Plan",
    "Raced",
    "Txn",
    "booking_attrs",
    "booking_from",
    "day_pk",
    "item_key",
    "next_version",
    "plan_booking",
    "pointer_item",
    "pointer_pk",
    "slot_key",
    "slot_pk",
    "slot_sk",
    "sticky_pk",
    "version_condition",
]

ONE = "#"
#: Attribute names that DynamoDB may take for keywords, always given as placeholders.
_NAMES = {"#p": "planned", "#s": "sent", "#t": "total"}

#: A sender's local day: (sender id, day).
DayKey = tuple[str, date]


def slot_pk(sender_id: str) -> str:
    return f"SL#{sender_id}"


def slot_sk(ms: int) -> str:
    return f"{ms:015d}"


def day_pk(sender_id: str) -> str:
    return f"SD#{sender_id}"


def pointer_pk(task_id: str) -> str:
    return f"BK#{task_id}"


def sticky_pk(recipient: str) -> str:
    return f"ST#{recipient}"


def item_key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": str_attr(pk), "sk": str_attr(sk)}


def booking_attrs(booking: Booking, *, sent: bool) -> dict[str, Any]:
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


def booking_from(item: Mapping[str, Any]) -> Booking:
    return Booking(
        sender_id=str(item["sid"]["S"]),
        at=parse_time(item["at"]["S"]),
        day=date.fromisoformat(item["day"]["S"]),
        task_id=str(item["task"]["S"]),
        campaign_id=str(item["cid"]["S"]),
        recipient=str(item["rc"]["S"]),
        cap=int(item["cap"]["N"]),
    )


def slot_key(booking: Booking) -> dict[str, Any]:
    return item_key(slot_pk(booking.sender_id), slot_sk(booking.at_ms))


@dataclass(frozen=True)
class Free:
    """An old slot a task still holds after it moved (phase 2 frees it)."""

    sender_id: str
    ms: int
    day: date
    sent: bool

    def as_json(self) -> list[object]:
        return [self.sender_id, self.ms, self.day.isoformat(), self.sent]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> Free:
        return cls(str(raw[0]), int(raw[1]), date.fromisoformat(str(raw[2])), bool(raw[3]))


@dataclass(frozen=True)
class Held:
    """A task's pointer as read: its booking, whether sent, its version and pending frees."""

    item: dict[str, Any]
    booking: Booking
    sent: bool
    version: int
    frees: tuple[Free, ...]

    @classmethod
    def of(cls, item: dict[str, Any]) -> Held:
        raw = item.get("fr")
        frees = () if raw is None else tuple(Free.from_json(f) for f in json.loads(raw["S"]))
        return cls(item, booking_from(item), bool(item["sent"]["BOOL"]), int(item["v"]["N"]), frees)

    @property
    def free(self) -> Free:
        """This booking, as a free to make once the task moved off it."""
        b = self.booking
        return Free(b.sender_id, b.at_ms, b.day, self.sent)


def pointer_item(
    booking: Booking, *, sent: bool, version: int, frees: Sequence[Free] = ()
) -> dict[str, Any]:
    item = {
        **item_key(pointer_pk(booking.task_id), ONE),
        **booking_attrs(booking, sent=sent),
        "v": num_attr(version),
    }
    if frees:
        item["fr"] = str_attr(dumps([f.as_json() for f in frees]))
    return item


def next_version(held: Held | None) -> int:
    return 1 if held is None else held.version + 1


def version_condition(held: Held | None) -> dict[str, Any]:
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
class Txn:
    """One TransactWriteItems being built: items tagged with what they are, and day deltas
    merged per day (a transaction may not touch one item twice)."""

    table: str
    items: list[dict[str, Any]] = field(default_factory=list)
    tags: list[tuple[str, object]] = field(default_factory=list)
    days: dict[DayKey, _Delta] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)

    def add(self, tag: str, what: object, item: dict[str, Any]) -> None:
        self.items.append(item)
        self.tags.append((tag, what))

    def day(self, key: DayKey, *, planned: int = 0, sent: int = 0, added: int = 0) -> None:
        delta = self.days.setdefault(key, _Delta())
        delta.planned += planned
        delta.sent += sent
        delta.added += added

    def size(self) -> int:
        return len(self.items) + len(self.days)

    def build(
        self, plan: Plan | None = None
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
                "Key": item_key(day_pk(key[0]), key[1].isoformat()),
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
class Move:
    """One booking of a call, and the task's booking before it (None: a new one)."""

    booking: Booking
    old: Held | None


@dataclass
class Plan:
    moves: list[Move]
    caps: dict[DayKey, int]
    credit: dict[DayKey, int]


class Raced(Exception):
    """Another process changed a task's booking between our read and our write."""


def plan_booking(bookings: Sequence[Booking], held: Mapping[str, Held]) -> Plan:
    """What a call books, checked as far as it can be without writing (as the in-memory store
    checks it): raises Overbooked for a slot twice in the call, a slot one of the call's tasks
    holds, or a day the call alone overfills."""
    caps: dict[DayKey, int] = {}
    added: dict[DayKey, int] = {}
    credit: dict[DayKey, int] = {}
    held_slots = {(h.booking.sender_id, h.booking.at_ms) for h in held.values()}
    claimed: set[tuple[str, int]] = set()
    moves: list[Move] = []
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
        moves.append(Move(b, old))
    for day, count in added.items():
        if count - credit.get(day, 0) > caps[day]:
            raise Overbooked(day[0], day=day[1])
    return Plan(moves, caps, credit)
