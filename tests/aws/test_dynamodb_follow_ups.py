"""What DynamoDbTaskStore asks of DynamoDB for follow-up marks and return dates (moto server):
the mark written in the finish's own transaction, the marks' (position, step) order past step 9,
and return dates read 100 keys a request. The contract (tests/contract/test_follow_up_marks.py)
runs against it too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import task_id
from tests.contract.store_backends import campaign, make_task, recipients
from tests.support.aws import client, dynamodb_url, reset

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
LATER = T0 + timedelta(hours=1)


class _Recording:
    """A DynamoDB client that keeps the requests of the operations it is told to watch."""

    def __init__(self, inner: Any, *watched: str) -> None:
        self.inner = inner
        self.watched = watched
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name not in self.watched:
            return found

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return found(**kwargs)

        return call


@pytest.fixture
def recording() -> Iterator[tuple[DynamoDbTaskStore, _Recording]]:
    reset()
    spy = _Recording(
        client("dynamodb", url=dynamodb_url()), "transact_write_items", "batch_get_item"
    )
    made = DynamoDbTaskStore(spy, "sqt", create_table=True)  # type: ignore[arg-type]
    yield made, spy
    made.close()


def _finish(store: DynamoDbTaskStore, tid: str) -> None:
    assert store.transition(tid, TaskState.PENDING, TaskState.RUNNING, at=T0)
    done = store.finish_send(tid, at=LATER, message_id=f"<{tid}@x>", follow_up=True)
    assert done.task is not None


def test_the_mark_is_written_in_the_finishs_own_transaction(
    recording: tuple[DynamoDbTaskStore, _Recording],
) -> None:
    store, spy = recording
    store.create_campaign(campaign(), recipients(1))
    assert store.insert_tasks([make_task("c1", 0)], at=T0) == 1
    assert store.transition("c1-0", TaskState.PENDING, TaskState.RUNNING, at=T0)
    spy.calls.clear()
    store.finish_send("c1-0", at=LATER, message_id="<m@x>", follow_up=True)
    [request] = [r for name, r in spy.calls if name == "transact_write_items"]
    keys = [item["Put"]["Item"]["pk"]["S"] for item in request["TransactItems"]]
    assert keys == ["T#c1-0", "FU#c1", "log"]  # the task, its mark, the log item: one write


def test_marks_come_in_position_then_step_order_past_step_nine(
    recording: tuple[DynamoDbTaskStore, _Recording],
) -> None:
    store, _ = recording
    store.create_campaign(campaign(), recipients(2))
    tasks = [
        make_task("c1", 0, id=task_id("c1", 0, 10), step=10, token="a"),
        make_task("c1", 1, step=1, token="b"),
        make_task("c1", 0, id=task_id("c1", 0, 2), step=2, token="c"),
    ]
    assert store.insert_tasks(tasks, at=T0) == 3
    for task in tasks:
        _finish(store, task.id)
    due = store.follow_ups_due("c1")
    assert [(t.position, t.step) for t in due] == [(0, 2), (0, 10), (1, 1)]
    assert store.follow_ups_made("c1", [t.id for t in due]) == 3
    assert not store.has_unfinished_tasks("c1")


def test_return_dates_are_read_100_keys_a_request(
    recording: tuple[DynamoDbTaskStore, _Recording],
) -> None:
    store, spy = recording
    for position in range(0, 250, 2):
        store.set_away("c1", position, date(2026, 12, 14), at=T0)
    spy.calls.clear()
    found = store.away_dates("c1", range(250))
    assert found == dict.fromkeys(range(0, 250, 2), date(2026, 12, 14))
    sizes = [len(r["RequestItems"]["sqt"]["Keys"]) for _, r in spy.calls]
    assert sizes == [100, 100, 50]
