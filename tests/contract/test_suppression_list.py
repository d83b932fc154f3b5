"""The SuppressionList contract (sendqueue.ports.SuppressionList), run against every task store.

The backends are the store contracts' (:mod:`tests.contract.store_backends`): memory,
SQLite, PostgreSQL and DynamoDB on moto. Besides the list itself: tasks inserted Cancelled with
a reason (a suppressed recipient's), and the count of a campaign's suppressed tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

import pytest

from sendqueue.domain.errors import IllegalTransition, InvalidField, StoreUnavailable
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.suppression import Suppression, SuppressionReason
from sendqueue.ports import SuppressionList, TaskStore
from tests.contract.store_backends import (
    T0,
    Backend,
    all_changes,
    backend,
    campaign,
    is_utc,
    make_task,
    recipients,
)

R = SuppressionReason
S = TaskState

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract


class Store(TaskStore, SuppressionList, Protocol):
    """Every task store is a suppression list too."""


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


def entry(
    email: str, reason: R = R.MANUAL, *, task: str | None = None, minutes: int = 0
) -> Suppression:
    return Suppression(email, reason, task, T0 + timedelta(minutes=minutes))


def test_suppress_is_insert_or_keep(store: Store) -> None:
    assert store.count_suppressions() == 0
    assert store.suppress([entry("a@example.com", R.BOUNCED, task="c1-0")]) == 1
    # Listed already: the first entry stays, whatever the second says.
    later = entry("a@example.com", R.UNSUBSCRIBED, task="c2-5", minutes=5)
    assert store.suppress([later, entry("b@example.com")]) == 1
    assert store.suppressed(["a@example.com"]) == {
        "a@example.com": entry("a@example.com", R.BOUNCED, task="c1-0")
    }
    assert store.count_suppressions() == 2
    assert store.suppress([]) == 0


def test_the_first_of_two_entries_in_one_call_is_kept(store: Store) -> None:
    first = entry("a@example.com", R.COMPLAINED)
    assert store.suppress([first, entry("a@example.com", R.MANUAL, minutes=1)]) == 1
    assert store.suppressed(["a@example.com"])["a@example.com"] == first


def test_suppressed_returns_only_listed_addresses_with_their_entries(store: Store) -> None:
    listed = [entry(f"r{i}@example.com", R.BOUNCED, task=f"c1-{i}") for i in range(0, 300, 3)]
    assert store.suppress(listed) == 100
    asked = [f"r{i}@example.com" for i in range(300)] + ["r0@example.com"]
    found = store.suppressed(asked)
    assert found == {e.email: e for e in listed}
    assert all(is_utc(e.at) for e in found.values())
    assert store.suppressed([]) == {}
    assert store.suppressed(iter(["nobody@example.com"])) == {}


def test_unsuppress_removes_and_says_whether_it_did(store: Store) -> None:
    store.suppress([entry("a@example.com"), entry("b@example.com")])
    assert store.unsuppress("a@example.com") is True
    assert store.unsuppress("a@example.com") is False
    assert store.suppressed(["a@example.com", "b@example.com"]).keys() == {"b@example.com"}
    assert store.count_suppressions() == 1
    # Gone means gone: it can be added again, with a new entry.
    again = entry("a@example.com", R.UNSUBSCRIBED, minutes=9)
    assert store.suppress([again]) == 1
    assert store.suppressed(["a@example.com"])["a@example.com"] == again


def test_list_suppressions_pages_in_address_order(store: Store) -> None:
    emails = [f"{c}{i}@example.com" for c in "zay" for i in range(4)]
    store.suppress([entry(e) for e in emails])
    pages: list[list[str]] = []
    after: str | None = None
    while page := store.list_suppressions(after=after, limit=5):
        pages.append([e.email for e in page])
        after = page[-1].email
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [e for page in pages for e in page] == sorted(emails)
    assert store.list_suppressions(limit=0) == []
    assert [e.email for e in store.list_suppressions(after="z", limit=10)] == sorted(emails)[8:]
    with pytest.raises(InvalidField) as info:
        store.list_suppressions(limit=-1)
    assert info.value.field == "limit"


def test_concurrent_suppressions_of_one_address_count_it_once(backend: Backend) -> None:
    handles = [backend.handle() for _ in range(4)]
    barrier = threading.Barrier(len(handles))
    counts: list[int] = []

    def run(i: int, store: Store) -> None:
        barrier.wait()
        counts.append(store.suppress([entry("same@example.com", task=f"c1-{i}")]))

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == [0, 0, 0, 1]
    assert handles[0].count_suppressions() == 1


def test_tasks_inserted_cancelled_keep_their_reason_and_are_counted(store: Store) -> None:
    store.create_campaign(campaign(), recipients(4))
    tasks = [
        make_task("c1", 0),
        make_task("c1", 1, state=S.CANCELLED, reason="suppressed: bounced"),
        make_task("c1", 2, state=S.CANCELLED, reason="suppressed: unsubscribed"),
        make_task("c1", 3),
    ]
    assert store.insert_tasks(tasks, at=T0) == 4
    assert store.insert_tasks(tasks, at=T0) == 0
    got = store.get_task("c1-1")
    assert got is not None
    assert (got.state, got.reason) == (S.CANCELLED, "suppressed: bounced")
    assert [(e.task_id, e.from_state, e.to_state, e.note) for e in all_changes(store)] == [
        ("c1-0", None, "Pending", None),
        ("c1-1", None, "Cancelled", "suppressed: bounced"),
        ("c1-2", None, "Cancelled", "suppressed: unsubscribed"),
        ("c1-3", None, "Pending", None),
    ]
    assert store.count_tasks("c1")[S.CANCELLED] == 2
    assert [t.id for t in store.list_tasks("c1", state=S.PENDING)] == ["c1-0", "c1-3"]
    assert store.count_suppressed_tasks("c1") == 2
    # A Pending task cancelled later with a reason counts too; one cancelled otherwise not.
    assert store.transition(
        "c1-0", S.PENDING, S.CANCELLED, at=T0, changes={"reason": "suppressed: manual"}
    )
    assert store.transition("c1-3", S.PENDING, S.CANCELLED, at=T0, note="cancelled by the user")
    assert store.count_suppressed_tasks("c1") == 3
    assert store.count_suppressed_tasks("no-such-campaign") == 0
    cancelled = store.get_task("c1-0")
    assert cancelled is not None and cancelled.reason == "suppressed: manual"


def test_tasks_are_not_inserted_cancelled_without_a_reason(store: Store) -> None:
    store.create_campaign(campaign(), recipients(2))
    with pytest.raises(IllegalTransition):
        store.insert_tasks([make_task("c1", 0), make_task("c1", 1, state=S.CANCELLED)], at=T0)
    assert store.get_task("c1-0") is None


def test_unreachable_backend_raises_store_unavailable(backend: Backend) -> None:
    store = backend.unreachable()
    calls: list[Callable[[], object]] = [
        lambda: store.suppress([entry("a@example.com")]),
        lambda: store.unsuppress("a@example.com"),
        lambda: store.suppressed(["a@example.com"]),
        lambda: store.list_suppressions(),
        store.count_suppressions,
        lambda: store.count_suppressed_tasks("c1"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()


def test_task_and_suppression_reads_a_task_with_its_address_entry(store: Store) -> None:
    store.create_campaign(campaign(), recipients(3))
    tasks = [
        make_task("c1", 0, email="Ada.Lovelace@Example.com"),
        make_task("c1", 1, email="grace@example.com"),
        make_task("c1", 2, email="Ünïcode.Ĳ@example.com"),  # Python's lower, not only ASCII
    ]
    store.insert_tasks(tasks, at=T0)
    ada = entry("ada.lovelace@example.com", R.BOUNCED, task="c0-1")
    uni = entry("ünïcode.ĳ@example.com", R.COMPLAINED)
    store.suppress([ada, uni])
    assert store.task_and_suppression("c1-0") == (store.get_task("c1-0"), ada)
    assert store.task_and_suppression("c1-1") == (store.get_task("c1-1"), None)
    assert store.task_and_suppression("c1-2") == (store.get_task("c1-2"), uni)
    assert store.task_and_suppression("c1-9") == (None, None)
