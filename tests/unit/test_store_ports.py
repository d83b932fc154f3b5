"""The store's ports per aggregate and the bundle the composition root hands out
(sendqueue.ports.tasks, sendqueue.ports.stores)."""

from __future__ import annotations

from typing import Any

import pytest

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.adapters.sql.postgres import PostgresTaskStore
from sendqueue.adapters.sql.sqlite import SqliteTaskStore
from sendqueue.ports import (
    Campaigns,
    ChangeLog,
    Counters,
    FeedbackCursors,
    FeedbackOutcomes,
    FeedbackStore,
    FollowUpMarks,
    Leases,
    SenderStore,
    SequenceEdits,
    StoreBackend,
    Stores,
    SuppressionList,
    Tasks,
    TaskStore,
    WebhookStore,
)
from sendqueue.ports.reads import CampaignReads
from sendqueue.testing import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, fake_app

AGGREGATES: list[Any] = [Campaigns, Tasks, ChangeLog, Leases, Counters]
KEPT_BESIDE: list[Any] = [
    SuppressionList,
    FeedbackStore,
    SenderStore,
    WebhookStore,
    CampaignReads,
    SequenceEdits,
    FollowUpMarks,
]


def _methods(port: Any) -> set[str]:
    """The methods a protocol declares itself (its own body, not its bases')."""
    return {name for name, value in vars(port).items() if callable(value) and name[0] != "_"}


def _all_methods(port: Any) -> set[str]:
    return set().union(*(_methods(base) for base in port.__mro__ if base is not object))


def test_the_aggregates_share_no_method_and_make_up_the_task_store() -> None:
    seen: set[str] = set()
    for port in AGGREGATES:
        mine = _methods(port)
        assert mine, port.__name__
        assert not mine & seen, port.__name__
        seen |= mine
    assert _all_methods(TaskStore) == seen | {"close"}


def test_the_feedback_store_is_its_outcomes_and_its_mailboxes_cursors() -> None:
    outcomes, cursors = _methods(FeedbackOutcomes), _methods(FeedbackCursors)
    assert outcomes and cursors and not outcomes & cursors
    assert _all_methods(FeedbackStore) == outcomes | cursors


def test_a_store_backend_is_every_port_together() -> None:
    expected = _all_methods(TaskStore).union(*(_all_methods(port) for port in KEPT_BESIDE))
    assert _all_methods(StoreBackend) == expected


@pytest.mark.parametrize(
    "backend", [InMemoryTaskStore, SqliteTaskStore, PostgresTaskStore, DynamoDbTaskStore]
)
def test_every_backend_implements_every_port_of_a_store_backend(backend: type) -> None:
    missing = [name for name in sorted(_all_methods(StoreBackend)) if not hasattr(backend, name)]
    assert missing == []


class _Closing(InMemoryTaskStore):
    closed = False

    def close(self) -> None:
        self.closed = True


def test_the_bundle_of_one_store_fills_every_field_with_it_and_closes_it() -> None:
    store = _Closing()
    stores = Stores.of(store)
    assert {name: value is store for name, value in vars(stores).items()} == dict.fromkeys(
        vars(stores), True
    )
    stores.close()
    assert store.closed


def test_the_container_builds_the_bundle_once_from_its_store() -> None:
    app = fake_app(clock=FakeClock(T0))
    assert app.stores is app.stores
    assert app.stores.tasks is app.store
    assert app.suppressions is app.store
    assert app.sender_store is app.store
