"""The DynamoDB SenderStore beyond the contract (moto server): calls larger than one
transaction, their undo, frees left by a process that died between the two phases, the reads
being queries, and items of an older release.

The contract (tests/contract/test_sender_store.py) runs against this adapter too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.domain.errors import Overbooked, StoreUnavailable
from sendqueue.domain.models import Recipient, task_id
from sendqueue.domain.senders import Booking, Sender, SenderDay
from tests.contract.store_backends import campaign, make_task
from tests.support.aws import client, dynamodb_url, reset

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
DAY = T0.date()
TABLE = "sqs"


@pytest.fixture
def store() -> Iterator[DynamoDbTaskStore]:
    reset()
    made = DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE, create_table=True)
    made.add_sender(Sender(id="s1", email="anna@example.com"))
    yield made
    made.close()


def other_handle() -> DynamoDbTaskStore:
    return DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE)


def booking(cid: str, n: int, minute: int, *, cap: int = 500, sid: str = "s1") -> Booking:
    at = T0 + timedelta(minutes=minute)
    return Booking(sid, at, at.date(), task_id(cid, n), cid, f"{cid}.{n}@example.com", cap)


def many(cid: str, count: int, *, first: int = 0, cap: int = 500) -> list[Booking]:
    """``count`` bookings a minute apart from ``first`` minutes after T0, all on DAY."""
    return [booking(cid, n, first + n, cap=cap) for n in range(count)]


def times(store: DynamoDbTaskStore) -> list[datetime]:
    return store.booked_times("s1", since=T0, until=T0 + timedelta(days=1))


def usage(store: DynamoDbTaskStore) -> list[SenderDay]:
    return store.sender_usage("s1", since=DAY, until=DAY + timedelta(days=1))


def raw_items(prefix: str) -> list[dict[str, Any]]:
    """Every item whose pk starts with ``prefix`` (a scan: for the test's eyes only)."""
    dynamodb = client("dynamodb", url=dynamodb_url())
    found = dynamodb.scan(
        TableName=TABLE,
        FilterExpression="begins_with(pk, :p)",
        ExpressionAttributeValues={":p": {"S": prefix}},
        ConsistentRead=True,
    )["Items"]
    dynamodb.close()
    return list(found)


def test_a_call_larger_than_a_transaction_books_everything(store: DynamoDbTaskStore) -> None:
    made = many("c1", 230)  # 461 items: five transactions
    store.book(made)
    assert usage(store) == [SenderDay(DAY, 230, 0)]
    assert times(store) == [b.at for b in made]
    assert all(store.booking_of(b.task_id) == b for b in made[::37])
    assert not [i for i in raw_items("BK#") if "fr" in i]


def test_a_large_call_refused_half_way_leaves_nothing(store: DynamoDbTaskStore) -> None:
    store.book([booking("c0", 0, 200)])  # the slot of the call's 201st booking
    with pytest.raises(Overbooked) as caught:
        store.book(many("c1", 230))
    assert caught.value.at == T0 + timedelta(minutes=200)
    assert usage(store) == [SenderDay(DAY, 1, 0)]
    assert times(store) == [T0 + timedelta(minutes=200)]
    assert [i["pk"]["S"] for i in raw_items("BK#")] == ["BK#c0-0"]


def test_a_large_call_over_the_cap_is_refused_by_a_later_transaction(
    store: DynamoDbTaskStore,
) -> None:
    # 10 on the day already, cap 200: the call's 195 pass the check before any write
    # (195 <= 200), and the day's condition refuses the transaction that would pass 200.
    store.book(many("c0", 10, first=500))
    with pytest.raises(Overbooked) as caught:
        store.book(many("c1", 195, cap=200))
    assert (caught.value.sender_id, caught.value.day, caught.value.at) == ("s1", DAY, None)
    assert usage(store) == [SenderDay(DAY, 10, 0)]
    assert len(times(store)) == 10


def test_a_large_move_within_a_full_day_frees_the_old_slots(store: DynamoDbTaskStore) -> None:
    store.book(many("c1", 120, cap=120))
    moved = [replace(b, at=b.at + timedelta(minutes=300)) for b in many("c1", 120, cap=120)]
    store.book(moved)  # the day is full, but the moves off it are credited
    assert usage(store) == [SenderDay(DAY, 120, 0)]
    assert times(store) == [b.at for b in moved]
    assert store.booking_of("c1-7") == moved[7]
    assert not [i for i in raw_items("BK#") if "fr" in i]
    store.book([booking("c2", 0, 5, cap=121)])  # an old slot is free again


def test_a_large_move_refused_half_way_keeps_the_old_bookings(store: DynamoDbTaskStore) -> None:
    before = many("c1", 120)
    store.book(before)
    store.book([booking("c0", 0, 300 + 110)])
    moved = [replace(b, at=b.at + timedelta(minutes=300)) for b in before]
    with pytest.raises(Overbooked):
        store.book(moved)
    assert times(store) == sorted([b.at for b in before] + [T0 + timedelta(minutes=410)])
    assert [store.booking_of(b.task_id) for b in before[::11]] == before[::11]
    assert usage(store) == [SenderDay(DAY, 121, 0)]
    assert not [i for i in raw_items("BK#") if "fr" in i]


def test_frees_left_by_a_process_that_died_are_made_by_the_next_write(
    store: DynamoDbTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = many("c1", 120, cap=240)
    store.book(before)
    dying = other_handle()
    monkeypatch.setattr(dying, "_finish_frees", lambda task_ids: None)  # dies after phase 1
    moved = [replace(b, at=b.at + timedelta(minutes=300)) for b in before]
    dying.book(moved)
    dying.close()
    # Both slots held and counted: conservative, never overbooked.
    assert len(times(store)) == 240
    assert usage(store) == [SenderDay(DAY, 240, 0)]
    assert store.booking_of("c1-0") == moved[0]
    # The next write of a task makes its frees first.
    assert store.release(["c1-0"]) == 1
    assert store.mark_sent("c1-1") is True
    store.book([booking("c1", 2, 600, cap=240)])
    # c1-0: both slots freed; c1-1: its old slot freed, sent; c1-2: its old slot freed, moved.
    assert usage(store) == [SenderDay(DAY, 235, 1)]
    assert not {T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)} & set(times(store))
    # Any booking call of the others finishes theirs (booked where they are: nothing else).
    store.book(moved[3:])
    assert usage(store) == [SenderDay(DAY, 118, 1)]
    assert times(store) == [moved[1].at] + [b.at for b in moved[3:]] + [T0 + timedelta(hours=10)]
    assert not [i for i in raw_items("BK#") if "fr" in i]


def test_concurrent_large_calls_never_pass_the_cap() -> None:
    reset()
    first = DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE, create_table=True)
    first.add_sender(Sender(id="s1", email="anna@example.com"))
    handles = [other_handle() for _ in range(3)]
    won: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(handles))

    def run(n: int, handle: DynamoDbTaskStore) -> None:
        barrier.wait()
        try:
            handle.book(many(f"c{n}", 60, first=n * 100, cap=100))
            won.append(n)
        except Overbooked:
            pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n, h)) for n, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(won) <= 1
    assert usage(first) == ([SenderDay(DAY, 60, 0)] if won else [])
    assert len(times(first)) == 60 * len(won)
    for handle in [first, *handles]:
        handle.close()


class _Recording:
    """A client proxy that records the operations called."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.inner, name)


def test_reads_are_queries_and_gets_never_scans(store: DynamoDbTaskStore) -> None:
    recording = _Recording(client("dynamodb", url=dynamodb_url()))
    spied = DynamoDbTaskStore(recording, TABLE)  # type: ignore[arg-type]
    spied.book(many("c1", 120))
    spied.release(["c1-0"])
    spied.mark_sent("c1-1")
    spied.booking_of("c1-2")
    times(spied)
    usage(spied)
    spied.sticky_senders(["c1.3@example.com"])
    spied.list_senders()
    spied.update_sender(Sender(id="s1", email="anna2@example.com"))
    assert "scan" not in recording.calls
    assert {"query", "batch_get_item", "transact_write_items"} <= set(recording.calls)
    spied.close()


def test_an_address_change_moves_its_claim(store: DynamoDbTaskStore) -> None:
    store.update_sender(Sender(id="s1", email="new@example.com"))
    store.add_sender(Sender(id="s2", email="anna@example.com"))  # the old address is free
    assert sorted(i["sk"]["S"] for i in raw_items("senderaddr")) == [
        "anna@example.com",
        "new@example.com",
    ]


def test_sticky_senders_are_read_100_at_a_time(store: DynamoDbTaskStore) -> None:
    made = many("c1", 150)
    store.book(made)
    got = store.sticky_senders([b.recipient for b in made] + ["nobody@example.com"])
    assert got == {b.recipient: "s1" for b in made}


def test_a_transaction_conflict_is_retried(store: DynamoDbTaskStore) -> None:
    class Conflicting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.left = 2

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def transact_write_items(self, **kw: Any) -> Any:
            if self.left:
                self.left -= 1
                reasons = [{"Code": "TransactionConflict"} for _ in kw["TransactItems"]]
                response: Any = {
                    "Error": {"Code": "TransactionCanceledException", "Message": "x"},
                    "CancellationReasons": reasons,
                }
                raise ClientError(response, "TransactWriteItems")
            return self.inner.transact_write_items(**kw)

    proxy = Conflicting(client("dynamodb", url=dynamodb_url()))
    through = DynamoDbTaskStore(proxy, TABLE)  # type: ignore[arg-type]
    through.book([booking("c1", 0, 0)])
    assert proxy.left == 0
    assert usage(store) == [SenderDay(DAY, 1, 0)]
    through.close()


def test_a_booking_before_1970_is_refused(store: DynamoDbTaskStore) -> None:
    at = datetime(1969, 12, 31, tzinfo=UTC)
    with pytest.raises(ValueError, match="1970"):
        store.book([Booking("s1", at, at.date(), "c1-0", "c1", "x@example.com", 5)])


def test_an_unreachable_store_is_store_unavailable_for_sender_calls() -> None:
    from botocore.config import Config

    no_retries = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)
    down = DynamoDbTaskStore(client("dynamodb", url="http://127.0.0.1:1", config=no_retries), TABLE)
    for call in (
        lambda: down.add_sender(Sender(id="s1", email="a@example.com")),
        lambda: down.release(["c1-0"]),
        lambda: down.mark_sent("c1-0"),
        lambda: down.sender_usage("s1", since=DAY, until=DAY + timedelta(days=1)),
        lambda: down.sticky_senders(["a@example.com"]),
    ):
        with pytest.raises(StoreUnavailable):
            call()
    down.close()


def test_items_written_before_senders_read_back_with_the_defaults(
    store: DynamoDbTaskStore,
) -> None:
    """Campaign, recipient and task items of an older release: no sender ids, no local time,
    no zones, no task sender."""
    store.create_campaign(campaign(), [Recipient(0, "a@example.com")])
    store.insert_tasks([make_task("c1", 0, sender_id="s1", sender="anna@example.com")], at=T0)
    dynamodb = client("dynamodb", url=dynamodb_url())

    def strip(key: dict[str, Any], *names: str) -> None:
        item = dynamodb.get_item(TableName=TABLE, Key=key, ConsistentRead=True)["Item"]
        doc = json.loads(item["d"]["S"])
        for name in names:
            del doc[name]
        item["d"] = {"S": json.dumps(doc)}
        dynamodb.put_item(TableName=TABLE, Item=item)

    strip({"pk": {"S": "campaign"}, "sk": {"S": "c1"}}, "sender_ids", "local_time")
    strip(
        {"pk": {"S": f"T#{task_id('c1', 0)}"}, "sk": {"S": "#"}}, "sender_id", "sender", "timezone"
    )
    recipient = raw_items("R#c1#")[0]
    strip({"pk": recipient["pk"], "sk": recipient["sk"]}, "timezone")
    dynamodb.close()

    got = store.get_campaign("c1")
    assert (got.sender_ids, got.local_time) == ((), False)
    assert store.list_recipients("c1")[0].timezone is None
    task = store.get_task(task_id("c1", 0))
    assert task is not None and (task.sender_id, task.sender, task.timezone) == (None,) * 3


def test_a_day_is_its_own_item_per_sender_and_day(store: DynamoDbTaskStore) -> None:
    store.book([booking("c1", 0, 0), booking("c1", 1, 60 * 24)])
    days = sorted((i["sk"]["S"], i["planned"]["N"], i["total"]["N"]) for i in raw_items("SD#s1"))
    assert days == [(str(DAY), "1", "1"), (str(DAY + timedelta(days=1)), "1", "1")]
    assert date.fromisoformat(days[0][0]) == DAY


def test_an_insert_failing_half_way_keeps_the_bookings_of_the_tasks_it_stored(
    store: DynamoDbTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks go in 49 a transaction, after their bookings: when a later transaction fails, the
    tasks already stored keep their slots (a resumed run skips them) and only the others' are
    given back."""
    store.create_campaign(campaign("c1"), [Recipient(n, f"r{n}@example.com") for n in range(60)])
    tasks = [make_task("c1", n, sender_id="s1", sender="anna@example.com") for n in range(60)]
    calls: list[int] = []
    insert_chunk = DynamoDbTaskStore._insert_chunk

    def second_fails(self: DynamoDbTaskStore, chunk: Any) -> Any:
        calls.append(len(chunk))
        if len(calls) == 2:
            raise StoreUnavailable("DynamoDB: throttled (simulated)")
        return insert_chunk(self, chunk)

    monkeypatch.setattr(DynamoDbTaskStore, "_insert_chunk", second_fails)
    with pytest.raises(StoreUnavailable):
        store.insert_tasks(tasks, at=T0, bookings=many("c1", 60))
    stored = store.get_tasks([t.id for t in tasks])
    assert len(stored) == calls[0] == 49
    assert all(store.booking_of(tid) is not None for tid in stored)
    assert [t.id for t in tasks if store.booking_of(t.id) is not None] == sorted(
        stored, key=lambda tid: int(tid.rsplit("-", 1)[1])
    )
    assert usage(store) == [SenderDay(DAY, 49, 0)]
