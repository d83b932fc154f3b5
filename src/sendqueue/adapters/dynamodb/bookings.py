"""Sender bookings in the DynamoDB table (:class:`BookingItems`, a base of
:class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`); the port's contract is
:class:`~sendqueue.ports.SenderStore`, the senders themselves are
:mod:`~sendqueue.adapters.dynamodb.senders`, and the items' keys, codecs and transactions
:mod:`~sendqueue.adapters.dynamodb.booking_items`.

Items (the table's key layout is in :mod:`~sendqueue.adapters.dynamodb.table`):

- ``SL#<sender>`` / the slot's epoch milliseconds (15 digits): a slot, held by one task
  (``task``, ``at``, ``day``, ``cid``, ``rc``, ``cap``, ``sent``). Put with
  ``attribute_not_exists``, so two tasks cannot hold one slot; ``booked_times`` is a query of
  the partition's sort-key range.
- ``SD#<sender>`` / ISO day: a sender's local day: ``planned``, ``sent`` and ``total`` (their
  sum, kept because a condition cannot add). A booking adds to it under the condition
  ``attribute_not_exists(total) OR total <= cap - added + freed`` (the call's own bookings of
  that day, and its moves off that day): a full day refuses the write. ``sender_usage`` queries
  the partition's range; the item stays when its counts go back to zero, which keeps the day
  one of the sender's sending days (``sending_days``, the warm-up's ramp).
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

from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.booking_items import (
    ONE,
    Free,
    Held,
    Move,
    Plan,
    Raced,
    Txn,
    booking_attrs,
    booking_from,
    day_pk,
    item_key,
    next_version,
    plan_booking,
    pointer_item,
    pointer_pk,
    slot_key,
    slot_pk,
    slot_sk,
    sticky_pk,
    version_condition,
)
from sendqueue.adapters.dynamodb.client import TableClient, error_code
from sendqueue.adapters.dynamodb.codec import num_attr, parse_time, str_attr
from sendqueue.adapters.dynamodb.table import ATTEMPTS, TXN_ITEMS, WRITERS
from sendqueue.domain.errors import InvalidField, Overbooked, StoreUnavailable
from sendqueue.domain.models import utc
from sendqueue.domain.senders import Booking, SenderDay, epoch_ms

__all__ = ["BookingItems"]


class BookingItems(TableClient):
    """The bookings half of :class:`~sendqueue.ports.SenderStore` in the store's table (see
    the module docstring)."""

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
                plan = plan_booking(list(wanted.values()), self._pointers(list(wanted)))
                try:
                    self._write_plan(plan)
                    break
                except Raced:
                    self._backoff(attempt)  # a task's booking changed: read again
            else:
                raise StoreUnavailable("DynamoDB: a booking kept losing races")
            self._stick(wanted.values())

    def _write_plan(self, plan: Plan) -> None:
        """Write the plan: one transaction when it fits, else the two phases (module
        docstring). Raises Overbooked or Raced, having undone what it wrote."""
        if not plan.moves:
            return
        whole = Txn(self._table)
        for move in plan.moves:
            self._add_move(whole, move, free_now=True)
        if whole.size() <= TXN_ITEMS:
            self._commit_booking(whole, plan)
            return
        # Phase 1, grouped by day so that a transaction touches few day items.
        chunks = [Txn(self._table)]
        for move in sorted(plan.moves, key=lambda m: (m.booking.sender_id, m.booking.day)):
            new_day = (move.booking.sender_id, move.booking.day)
            if chunks[-1].size() + 2 + (new_day not in chunks[-1].days) > TXN_ITEMS:
                chunks.append(Txn(self._table))
            self._add_move(chunks[-1], move, free_now=False)
        done: list[Txn] = []
        try:
            for chunk in chunks:
                self._commit_booking(chunk, plan)
                done.append(chunk)
        except (Overbooked, Raced):
            self._undo(done)
            raise
        # Phase 2: the moved tasks' old slots.
        self._finish_frees([m.booking.task_id for m in plan.moves if m.old is not None])

    def _add_move(self, txn: Txn, move: Move, *, free_now: bool) -> None:
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
                    "Item": {**slot_key(b), **booking_attrs(b, sent=False)},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
        )
        frees = () if old is None or free_now else (old.free,)
        pointer = pointer_item(b, sent=False, version=next_version(old), frees=frees)
        txn.add(
            "pointer",
            b.task_id,
            {"Put": {"TableName": self._table, "Item": pointer, **version_condition(old)}},
        )
        txn.day((b.sender_id, b.day), planned=1, added=1)
        if old is not None and free_now:
            self._add_free(txn, b.task_id, old.free)

    def _add_free(self, txn: Txn, task_id: str, free: Free) -> None:
        """Free a slot ``task_id`` holds: delete it (while the task holds it), and take it off
        its day's count."""
        txn.add(
            "free",
            (task_id, free),
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": item_key(slot_pk(free.sender_id), slot_sk(free.ms)),
                    "ConditionExpression": "task = :t",
                    "ExpressionAttributeValues": {":t": str_attr(task_id)},
                }
            },
        )
        if free.sent:
            txn.day((free.sender_id, free.day), sent=-1)
        else:
            txn.day((free.sender_id, free.day), planned=-1)

    def _commit_booking(self, txn: Txn, plan: Plan) -> None:
        """Commit a booking transaction, or raise Raced (a pointer or an old slot changed),
        else Overbooked (for a taken slot before a full day)."""
        items, tags = txn.build(plan)
        failed = [tags[i] for i in self._commit(items)]
        if not failed:
            return
        if any(tag in ("pointer", "free") for tag, _ in failed):
            raise Raced
        for tag, what in failed:
            if tag == "slot" and isinstance(what, Booking):
                raise Overbooked(what.sender_id, at=what.at)
        for tag, what in failed:
            if tag == "day" and isinstance(what, tuple):
                raise Overbooked(what[0], day=what[1])
        raise Raced  # not reached: every item is tagged

    def _undo(self, done: Sequence[Txn]) -> None:
        """Take back committed phase-1 transactions: delete their slots, put their pointers
        back as read, subtract their day additions (old slots were never freed, so nothing
        has to be taken back from anyone). A task whose pointer changed since (another process
        moved, released or sent it) is left to that process, which freed what it had to."""
        for txn in reversed(done):
            moves = list(txn.moves)
            for attempt in range(ATTEMPTS):
                if not moves:
                    break
                undo = Txn(self._table)
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

    def _add_unbook(self, txn: Txn, move: Move) -> None:
        b, old = move.booking, move.old
        txn.add(
            "slot",
            b,
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": slot_key(b),
                    "ConditionExpression": "task = :t",
                    "ExpressionAttributeValues": {":t": str_attr(b.task_id)},
                }
            },
        )
        written = {
            "ConditionExpression": "v = :v",
            "ExpressionAttributeValues": {":v": num_attr(next_version(old))},
        }
        key = item_key(pointer_pk(b.task_id), ONE)
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
                    txn = Txn(self._table)
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

    def _add_release(self, txn: Txn, held: Held) -> None:
        b = held.booking
        txn.add(
            "pointer",
            b.task_id,
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": item_key(pointer_pk(b.task_id), ONE),
                    **version_condition(held),
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
                txn = Txn(self._table)
                txn.add(
                    "pointer",
                    task_id,
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": pointer_item(b, sent=True, version=next_version(held)),
                            **version_condition(held),
                        }
                    },
                )
                txn.add(
                    "slot",
                    b,
                    {
                        "Update": {
                            "TableName": self._table,
                            "Key": slot_key(b),
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
    def _pointers(self, task_ids: Sequence[str]) -> dict[str, Held]:
        """The tasks' pointers, read consistently, with no frees pending (made first)."""
        for attempt in range(ATTEMPTS):
            items = self._batch_get([(pointer_pk(t), ONE) for t in task_ids])
            held = {h.booking.task_id: h for h in map(Held.of, items)}
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

    def _make_frees(self, pending: Sequence[Held]) -> None:
        """Free what the pointers of ``pending`` record, in transactions: per task its old
        slots, their day counts, and the pointer without ``fr`` (conditional on its version).
        A slot the task no longer holds (a removed sender's) is skipped. Returns early when a
        pointer changed: the caller reads again."""
        skip: set[tuple[str, Free]] = set()
        todo = list(pending)
        while todo:
            txn = Txn(self._table)
            chunk: list[Held] = []
            for held in todo:
                if chunk and txn.size() + 1 + 2 * len(held.frees) > TXN_ITEMS:
                    break
                chunk.append(held)
                pointer = pointer_item(held.booking, sent=held.sent, version=next_version(held))
                txn.add(
                    "pointer",
                    held.booking.task_id,
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": pointer,
                            **version_condition(held),
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
            item = self._get(pointer_pk(task_id), ONE)
        return None if item is None else booking_from(item)

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
                        ":pk": str_attr(slot_pk(sender_id)),
                        ":low": str_attr(slot_sk(low)),
                        ":high": str_attr(slot_sk(high - 1)),
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
                        ":pk": str_attr(day_pk(sender_id)),
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

    def sending_days(self, sender_id: str, *, since: date) -> list[date]:
        # A day item stays when its bookings go (at zero counts); one is written only by a
        # committed booking (a phase-1 booking undone later did hold its day meanwhile).
        with self._errors("read a sender's sending days"):
            items = self._query(
                KeyConditionExpression="pk = :pk AND sk >= :low",
                ExpressionAttributeValues={
                    ":pk": str_attr(day_pk(sender_id)),
                    ":low": str_attr(since.isoformat()),
                },
                ProjectionExpression="sk",
                ConsistentRead=True,
            )
            return [date.fromisoformat(item["sk"]["S"]) for item in items]

    # -- sticky senders ----------------------------------------------------------------------
    def sticky_senders(self, recipients: Collection[str]) -> dict[str, str]:
        keys = [(sticky_pk(r), ONE) for r in sorted(set(recipients))]
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
                    Item={**item_key(sticky_pk(recipient), ONE), "sid": str_attr(sender_id)},
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
