"""Senders in the DynamoDB table (:class:`SenderItems`, a base of
:class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`); the port's contract is
:class:`~sendqueue.ports.SenderStore`, and their bookings are
:mod:`~sendqueue.adapters.dynamodb.bookings`.

Items (the table's key layout is in :mod:`~sendqueue.adapters.dynamodb.table`):

- ``sender`` / id: a sender (``d`` the sender as JSON, transport as given); ``senderaddr`` /
  its address lower-cased: the claim that keeps an address to one sender (``sid``). Both are
  written in one transaction, each ``attribute_not_exists``; ``update_sender`` moves the claim
  in a transaction when the address changes. ``list_senders`` queries the ``sender``
  partition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.booking_items import ONE, day_pk, item_key, pointer_pk, slot_pk
from sendqueue.adapters.dynamodb.client import TableClient, error_code
from sendqueue.adapters.dynamodb.codec import dumps, str_attr
from sendqueue.adapters.dynamodb.table import ATTEMPTS, WRITERS
from sendqueue.domain.errors import Conflict, NotFound, StoreUnavailable
from sendqueue.domain.senders import OAuthGrant, Sender

__all__ = ["SenderItems"]

_SENDERS = "sender"
_ADDRESSES = "senderaddr"


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
            "imap": sender.imap,
            "signature_text": sender.signature_text,
            "signature_html": sender.signature_html,
            "oauth": None if sender.oauth is None else sender.oauth.as_dict(),
        }
    )


def _sender_item(sender: Sender) -> dict[str, Any]:
    return {
        **item_key(_SENDERS, sender.id),
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
        imap=doc.get("imap"),
        signature_text=doc.get("signature_text", ""),
        signature_html=doc.get("signature_html"),
        oauth=OAuthGrant.from_dict(doc.get("oauth")),
    )


def _claim_item(sender: Sender) -> dict[str, Any]:
    return {**item_key(_ADDRESSES, sender.email.lower()), "sid": str_attr(sender.id)}


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
                                    "Key": item_key(_ADDRESSES, old_address),
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
                    ":pk": str_attr(slot_pk(sender_id)),
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
                            "Key": item_key(_SENDERS, sender_id),
                            "ConditionExpression": "attribute_exists(pk)",
                        }
                    },
                    {
                        "Delete": {
                            "TableName": self._table,
                            "Key": item_key(_ADDRESSES, str(current["em"]["S"])),
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
                ExpressionAttributeValues={":pk": str_attr(slot_pk(sender_id))},
                ProjectionExpression="pk, sk, task, ms",
                ConsistentRead=True,
            )
        )
        days = list(
            self._query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": str_attr(day_pk(sender_id))},
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        )

        def drop_pointer(slot: dict[str, Any]) -> None:
            try:
                self._db.delete_item(
                    TableName=self._table,
                    Key=item_key(pointer_pk(str(slot["task"]["S"])), ONE),
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
