"""The WebhookStore contract (sendqueue.ports.webhooks.WebhookStore), run against every task
store: memory, SQLite, PostgreSQL and DynamoDB on moto (the TaskStore contract's backends)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Protocol, cast

import pytest

from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import TaskChanges
from sendqueue.domain.webhooks import (
    DEAD_LETTER,
    DeliveryRecord,
    EndpointChanges,
    EventTask,
    WebhookEndpoint,
)
from sendqueue.ports import TaskStore
from sendqueue.ports.webhooks import WebhookStore
from tests.contract.test_task_store import (
    T0,
    Backend,
    backend,
    campaign,
    is_utc,
    make_task,
    recipients,
)

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract


class Store(TaskStore, WebhookStore, Protocol):
    """Every task store keeps webhooks too."""


@pytest.fixture
def store(backend: Backend) -> Store:
    return cast(Store, backend.handle())


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


def test_a_dead_letter_is_logged_as_a_change_of_its_task(store: Store) -> None:
    store.create_campaign(campaign(), recipients(1))
    store.insert_tasks([make_task("c1", 0)], at=T0)
    before = store.last_change_id()
    assert store.log_dead_letter("c1-0", "boom " * 200, at=T0 + timedelta(minutes=1))
    entries = store.changes_after(before)
    assert [(e.task_id, e.from_state, e.to_state) for e in entries] == [
        ("c1-0", "Pending", DEAD_LETTER)
    ]
    assert entries[0].campaign_id == "c1" and entries[0].note == ("boom " * 200)[:500]
    assert entries[0].at == T0 + timedelta(minutes=1)
    assert not store.log_dead_letter("c1-9", "boom", at=T0)
    assert store.last_change_id() == entries[0].id


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
