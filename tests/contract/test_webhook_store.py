"""The WebhookStore contract (sendqueue.ports.webhooks.WebhookStore), run against every task
store: memory, SQLite, PostgreSQL and DynamoDB on moto (the TaskStore contract's backends).
The dead-letter relay is held to "once per letter id", across handles and racing threads."""

from __future__ import annotations

import base64
import string
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Protocol, cast

import pytest

from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import ChangeLogEntry, TaskChanges
from sendqueue.domain.webhooks import (
    DEAD_LETTER,
    DeliveryRecord,
    EndpointChanges,
    EventTask,
    RelayedLetter,
    WebhookEndpoint,
    delivery_cursor,
)
from sendqueue.ports import TaskStore
from sendqueue.ports.webhooks import WebhookStore
from tests.contract.store_backends import (
    T0,
    Backend,
    backend,
    campaign,
    is_utc,
    make_task,
    recipients,
)

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract

_B64 = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"


class Store(TaskStore, WebhookStore, Protocol):
    """Every task store keeps webhooks too."""


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


def endpoint(eid: str = "wh_1", minutes: int = 0, **kw: object) -> WebhookEndpoint:
    base = WebhookEndpoint(
        id=eid,
        url=f"https://{eid}.example.com/in",
        created_at=T0 + timedelta(minutes=minutes),
        secret="whsec_" + "A" * 32,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def record(eid: str, n: int, *, minutes: int = 0, error: str | None = None) -> DeliveryRecord:
    return DeliveryRecord(
        endpoint_id=eid,
        event_id=f"evt_{n}",
        event_type="email.sent",
        at=T0 + timedelta(minutes=minutes),
        attempt=1,
        latency_ms=12,
        status=None if error else 200,
        error=error,
    )


def test_an_endpoint_round_trips(store: Store) -> None:
    full = endpoint(
        event_types=("email.sent", "campaign.paused"),
        campaign_ids=("c1",),
        enabled=False,
        disabled_reason="why",
        previous_secret="whsec_" + "B" * 32,
        previous_secret_expires_at=T0 + timedelta(hours=24),
        cursor=2**40,
        attempts=3,
        retry_at=T0 + timedelta(seconds=40),
        failing_since=T0,
    )
    store.add_endpoint(full)
    got = store.get_endpoint("wh_1")
    assert got == full
    assert got is not None and is_utc(got.created_at) and got.retry_at is not None
    assert is_utc(got.retry_at)
    assert store.get_endpoint("wh_2") is None


def test_adding_an_id_twice_is_a_conflict_and_keeps_the_first(store: Store) -> None:
    store.add_endpoint(endpoint())
    with pytest.raises(Conflict):
        store.add_endpoint(endpoint(url="https://other.example.com"))
    got = store.get_endpoint("wh_1")
    assert got is not None and got.url == "https://wh_1.example.com/in"


def test_endpoints_list_oldest_first(store: Store) -> None:
    store.add_endpoint(endpoint("wh_b", minutes=2))
    store.add_endpoint(endpoint("wh_a", minutes=5))
    store.add_endpoint(endpoint("wh_c", minutes=1))
    assert [e.id for e in store.list_endpoints()] == ["wh_c", "wh_b", "wh_a"]


def test_update_sets_only_what_is_given(store: Store) -> None:
    store.add_endpoint(endpoint(event_types=("email.sent",)))
    changes: EndpointChanges = {
        "cursor": 42,
        "attempts": 2,
        "retry_at": T0 + timedelta(seconds=10),
        "campaign_ids": ("c9",),
    }
    got = store.update_endpoint("wh_1", changes)
    assert got is not None
    assert (got.cursor, got.attempts, got.campaign_ids) == (42, 2, ("c9",))
    assert got.event_types == ("email.sent",)
    assert store.get_endpoint("wh_1") == got
    assert store.update_endpoint("wh_9", {"cursor": 1}) is None
    assert store.get_endpoint("wh_9") is None


def test_update_refuses_an_unknown_field(store: Store) -> None:
    store.add_endpoint(endpoint())
    with pytest.raises(InvalidField) as caught:
        store.update_endpoint("wh_1", cast(EndpointChanges, {"id": "wh_2"}))
    assert caught.value.field == "changes"
    assert store.get_endpoint("wh_1") == endpoint()


def test_the_delivery_log_reads_newest_first_per_endpoint(store: Store) -> None:
    store.add_endpoint(endpoint("wh_1"))
    store.add_endpoint(endpoint("wh_2"))
    store.record_deliveries([record("wh_1", n, minutes=n) for n in range(5)])
    store.record_deliveries([record("wh_2", 9, error="HTTP 500 (not 2xx)")])
    got = store.deliveries("wh_1", limit=3)
    assert [r.event_id for r in got] == ["evt_4", "evt_3", "evt_2"]
    assert got[0] == record("wh_1", 4, minutes=4)
    assert [r.error for r in store.deliveries("wh_2")] == ["HTTP 500 (not 2xx)"]
    assert store.deliveries("wh_3") == []
    store.record_deliveries([])


def _walk(
    store: Store, eid: str, size: int, before: str | None = None
) -> list[list[DeliveryRecord]]:
    """Every page of the endpoint's log from ``before`` on, each one's last cursor the next
    page's ``before``, until a page comes back short."""
    pages = []
    while True:
        page = store.deliveries(eid, limit=size, before=before)
        pages.append(page)
        if len(page) < size:
            return pages
        before = page[-1].cursor


def test_the_log_pages_by_cursor_each_attempt_once_newest_first(store: Store) -> None:
    store.add_endpoint(endpoint("wh_1"))
    store.add_endpoint(endpoint("wh_2"))
    # 250 attempts, seven at a time at one instant (so instants are shared across the page
    # boundaries at 150 and 50), logged in batches between another endpoint's attempts
    made = [record("wh_1", n, minutes=n // 7) for n in range(250)]
    for start in range(0, 250, 50):
        store.record_deliveries(made[start : start + 50])
        store.record_deliveries([record("wh_2", 1000 + start, minutes=start // 7)])
    pages = _walk(store, "wh_1", 100)
    assert [len(p) for p in pages] == [100, 100, 50]
    walked = [r for p in pages for r in p]
    assert walked == made[::-1]  # every attempt once, newest first (equality ignores cursors)
    cursors = [r.cursor for r in walked]
    assert all(isinstance(c, str) and c for c in cursors) and len(set(cursors)) == 250
    assert store.deliveries("wh_1", limit=10, before=walked[-1].cursor) == []
    # a cursor stays put while newer attempts are logged: the same older page after them
    store.record_deliveries([record("wh_1", n, minutes=40) for n in range(250, 260)])
    again = store.deliveries("wh_1", limit=100, before=pages[0][-1].cursor)
    assert [r.event_id for r in again] == [r.event_id for r in pages[1]]
    assert [r.cursor for r in again] == [r.cursor for r in pages[1]]
    assert [r.event_id for r in store.deliveries("wh_1", limit=3)] == [
        "evt_259",
        "evt_258",
        "evt_257",
    ]


def _non_canonical(cursor: str) -> str | None:
    """The same bytes with the unused low bits of the last character set (None: it has none)."""
    if len(cursor) % 4 not in (2, 3):
        return None
    return cursor[:-1] + _B64[_B64.index(cursor[-1]) | 1]


def test_a_cursor_not_of_this_log_is_refused_naming_before(store: Store) -> None:
    store.add_endpoint(endpoint("wh_1"))
    store.add_endpoint(endpoint("wh_2"))
    store.record_deliveries([record("wh_1", n) for n in range(3)] + [record("wh_2", 9)])
    own = store.deliveries("wh_1")[1].cursor
    other = store.deliveries("wh_2")[0].cursor  # another endpoint's
    assert own is not None and other is not None
    kind, _, key = base64.urlsafe_b64decode(own + "==").decode().split(":", 2)
    foreign = [delivery_cursor(k, "wh_1", key) for k in ("sql", "dynamodb", "memory") if k != kind]
    forged = [
        delivery_cursor(kind, "wh_1", key)
        for key in ("", "0", "-1", "x", "9" * 20, "1 OR 1=1", "2026-12-01T08:00:00#", key + " ")
    ]
    bad = ["", "nope!", "not base64", own + "=", own + "==", "A" * 401, other, _non_canonical(own)]
    for cursor in [c for c in bad if c is not None] + foreign + forged:
        for limit in (0, 10):
            with pytest.raises(InvalidField) as caught:
                store.deliveries("wh_1", limit=limit, before=cursor)
            assert caught.value.field == "before", cursor
    assert [r.event_id for r in store.deliveries("wh_1", before=own)] == ["evt_0"]


def test_failed_since_lists_failed_events_once_oldest_first(store: Store) -> None:
    store.add_endpoint(endpoint())
    store.record_deliveries(
        [
            record("wh_1", 1, minutes=0, error="x"),
            record("wh_1", 2, minutes=1, error="x"),
            record("wh_1", 3, minutes=2),
            record("wh_1", 2, minutes=3, error="x"),
            record("wh_1", 4, minutes=4, error="x"),
        ]
    )
    assert store.failed_since("wh_1", T0 + timedelta(minutes=1)) == ["evt_2", "evt_4"]


def test_prune_deletes_old_attempts_only(store: Store) -> None:
    store.add_endpoint(endpoint())
    store.record_deliveries([record("wh_1", n, minutes=n) for n in range(4)])
    assert store.prune_deliveries(T0 + timedelta(minutes=2)) == 2
    assert [r.event_id for r in store.deliveries("wh_1")] == ["evt_3", "evt_2"]


def test_remove_deletes_the_endpoint_and_its_log(store: Store) -> None:
    store.add_endpoint(endpoint())
    store.record_deliveries([record("wh_1", 1)])
    assert store.remove_endpoint("wh_1")
    assert store.get_endpoint("wh_1") is None
    assert store.deliveries("wh_1") == []
    assert not store.remove_endpoint("wh_1")
    store.add_endpoint(endpoint())
    assert store.deliveries("wh_1") == []


def letter(n: int, task: str = "c1-0", *, error: str = "boom", minutes: int = 1) -> RelayedLetter:
    return RelayedLetter(f"dl-{n:04d}", task, error, T0 + timedelta(minutes=minutes))


def dead_letter_entries(store: Store, after: int) -> list[ChangeLogEntry]:
    return [e for e in store.changes_after(after, limit=10_000) if e.to_state == DEAD_LETTER]


def test_a_relayed_dead_letter_is_logged_as_a_change_of_its_task(store: Store) -> None:
    store.create_campaign(campaign(), recipients(1))
    store.insert_tasks([make_task("c1", 0)], at=T0)
    before = store.last_change_id()
    relayed = [letter(1, error="boom " * 200), letter(2, "c1-9")]  # c1-9: no such task
    assert store.relay_dead_letters(relayed) == ["dl-0001"]
    entries = store.changes_after(before)
    assert [(e.task_id, e.from_state, e.to_state) for e in entries] == [
        ("c1-0", "Pending", DEAD_LETTER)
    ]
    assert entries[0].campaign_id == "c1" and entries[0].note == ("boom " * 200)[:500]
    assert entries[0].at == T0 + timedelta(minutes=1)  # when it failed, not when relayed
    assert store.last_change_id() == entries[0].id
    assert store.relay_dead_letters([]) == []


def test_relaying_a_letter_twice_makes_one_change_log_entry(backend: Backend, store: Store) -> None:
    store.create_campaign(campaign(), recipients(2))
    store.insert_tasks([make_task("c1", 0), make_task("c1", 1)], at=T0)
    before = store.last_change_id()
    assert store.relay_dead_letters([letter(1), letter(1)]) == ["dl-0001"]
    assert store.relay_dead_letters([letter(1)]) == []
    # another handle (another process) meets the same letter, and a new one beside it
    other = backend.handle()
    assert other.relay_dead_letters([letter(1), letter(2, "c1-1")]) == ["dl-0002"]
    entries = dead_letter_entries(store, before)
    assert [e.task_id for e in entries] == ["c1-0", "c1-1"]
    assert store.last_change_id() == entries[-1].id


def test_a_letter_of_an_unknown_task_is_not_looked_at_again(store: Store) -> None:
    store.create_campaign(campaign(), recipients(1))
    before = store.last_change_id()
    assert store.relay_dead_letters([letter(1)]) == []  # the task is not there
    store.insert_tasks([make_task("c1", 0)], at=T0)
    assert store.relay_dead_letters([letter(1)]) == []  # its marker was written alone
    assert dead_letter_entries(store, before) == []


def test_many_letters_are_relayed_once_each_in_the_order_given(store: Store) -> None:
    store.create_campaign(campaign(), recipients(3))
    store.insert_tasks([make_task("c1", p) for p in range(3)], at=T0)
    before = store.last_change_id()
    letters = [letter(n, f"c1-{n % 3}", error=f"e{n}") for n in range(120, 0, -1)]
    assert store.relay_dead_letters(letters[:7]) == [r.letter_id for r in letters[:7]]
    assert store.relay_dead_letters(letters) == [r.letter_id for r in letters[7:]]
    entries = dead_letter_entries(store, before)
    assert sorted(e.note or "" for e in entries) == sorted(r.error for r in letters)
    assert [e.note for e in entries[:7]] == [r.error for r in letters[:7]]


def test_concurrent_relays_of_the_same_letters_make_one_entry_each(
    backend: Backend, store: Store
) -> None:
    store.create_campaign(campaign(), recipients(2))
    store.insert_tasks([make_task("c1", 0), make_task("c1", 1)], at=T0)
    before = store.last_change_id()
    letters = [letter(n, f"c1-{n % 2}") for n in range(30)]
    handles = [backend.handle() for _ in range(3)]
    barrier = threading.Barrier(len(handles))
    logged: list[list[str]] = [[] for _ in handles]
    failures: list[BaseException] = []

    def relay(i: int) -> None:
        try:
            barrier.wait(10)
            # each handle meets the letters in its own order
            mine = letters[i * 10 :] + letters[: i * 10]
            logged[i] = handles[i].relay_dead_letters(mine)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=relay, args=(i,)) for i in range(len(handles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert sorted(i for ids in logged for i in ids) == sorted(r.letter_id for r in letters)
    assert len(dead_letter_entries(store, before)) == len(letters)


def test_a_relayed_letter_needs_its_ids() -> None:
    with pytest.raises(InvalidField) as caught:
        RelayedLetter("", "c1-0", "boom", T0)
    assert caught.value.field == "letter_id"
    with pytest.raises(InvalidField) as caught:
        RelayedLetter("dl-1", "x" * 129, "boom", T0)
    assert caught.value.field == "task_id"


def test_event_tasks_read_recipient_sender_and_message_id_as_stored_now(store: Store) -> None:
    store.create_campaign(campaign(), recipients(3))
    store.insert_tasks([make_task("c1", 0), make_task("c1", 1, sender="anna@example.com")], at=T0)
    assert store.event_tasks(["c1-0", "c1-1", "c1-9"]) == {
        "c1-0": EventTask("r0@example.com", None, None),
        "c1-1": EventTask("r1@example.com", "anna@example.com", None),
    }
    store.transition("c1-0", TaskState.PENDING, TaskState.RUNNING, at=T0)
    changes: TaskChanges = {"message_id": "<c1-0@example.com>", "sent_at": T0}
    store.transition("c1-0", TaskState.RUNNING, TaskState.FINISHED, at=T0, changes=changes)
    assert store.event_tasks({"c1-0"}) == {
        "c1-0": EventTask("r0@example.com", None, "<c1-0@example.com>")
    }
    assert store.event_tasks([]) == {}
