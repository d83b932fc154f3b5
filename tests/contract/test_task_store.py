"""The TaskStore contract (sendqueue.ports.TaskStore), run against every adapter.

Each test receives ``store`` (and, where it needs more handles on the same data, ``backend``).
To run the suite against a new adapter, add one entry to ``BACKENDS``: a function that returns
a :class:`Backend` whose ``open`` makes a new handle on one shared database (a new engine, a new
client), and whose ``open_unreachable`` makes a handle on a backend that cannot be reached.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from sendqueue.adapters.sql import open_store
from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    InvalidField,
    NotFound,
    StoreUnavailable,
)
from sendqueue.domain.lifecycle import TASK_TRANSITIONS, CampaignState, TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, Move, Recipient, Task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.ports import TaskStore
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.aws import dynamodb_backend

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
S = TaskState


# --- backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    """How to reach one adapter's storage from a test."""

    name: str
    open: Callable[[], TaskStore]
    open_unreachable: Callable[[], TaskStore]
    #: Tasks in the bulk-insert test. A backend may lower it only where the size costs it
    #: something the real service does not (and says why); the test checks the same property.
    bulk_tasks: int = 20_000
    opened: list[TaskStore] = field(default_factory=list)

    def handle(self) -> TaskStore:
        """A new handle on the shared data, closed at the end of the test."""
        store = self.open()
        self.opened.append(store)
        return store

    def unreachable(self) -> TaskStore:
        store = self.open_unreachable()
        self.opened.append(store)
        return store


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    shared = InMemoryTaskStore()

    def unreachable() -> TaskStore:
        store = InMemoryTaskStore()
        store.set_available(False)
        return store

    return Backend("memory", lambda: shared, unreachable)


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    missing = f"sqlite:///{tmp_path / 'no-such-dir' / 'store.db'}"
    return Backend("sqlite", lambda: open_store(url), lambda: open_store(missing, upgrade=False))


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url = request.getfixturevalue("postgres_url")
    # Port 1 on loopback: connection refused at once.
    refused = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"
    return Backend("postgres", lambda: open_store(url), lambda: open_store(refused, upgrade=False))


BACKENDS = [
    pytest.param(_memory, id="memory"),
    pytest.param(_sqlite, id="sqlite"),
    pytest.param(_postgres, id="postgres", marks=pytest.mark.postgres),
    # moto server (tests/support/aws.py), like the EventBridge case of the Scheduler contract.
    pytest.param(dynamodb_backend, id="dynamodb"),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = request.param(request, tmp_path)
    try:
        yield made
    finally:
        for store in made.opened:
            store.close()


@pytest.fixture
def store(backend: Backend) -> TaskStore:
    return backend.handle()


# --- builders ---------------------------------------------------------------------------------


def campaign(cid: str = "c1", *, created_at: datetime = T0, **kw: Any) -> Campaign:
    policy = SendingPolicy(
        timezone="Europe/Berlin",
        per_day=50,
        weekdays=frozenset({0, 1, 2, 3, 4}),
        windows=(Window(9 * 60, 12 * 60), Window(13 * 60, 17 * 60)),
        start=datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
        skip_dates=frozenset({date(2026, 12, 24)}),
        jitter_seconds=30,
        seed=7,
    )
    values: dict[str, Any] = {
        "id": cid,
        "name": f"Campaign {cid}",
        "policy": policy,
        "from_addr": "news@example.com",
        "reply_to": "replies@example.com",
        "created_at": created_at,
        "updated_at": created_at,
    }
    values.update(kw)
    return Campaign(**values)


def recipients(count: int) -> list[Recipient]:
    return [
        Recipient(
            position=i,
            email=f"r{i}@example.com",
            name=f"R {i}",
            subject=f"Hello {i}",
            text=f"Body {i}",
            html=f"<p>Body {i}</p>" if i % 2 else None,
            variables={"n": str(i)},
        )
        for i in range(count)
    ]


def make_task(cid: str, position: int, *, send_at: datetime | None = None, **kw: Any) -> Task:
    values: dict[str, Any] = {
        "id": task_id(cid, position),
        "campaign_id": cid,
        "position": position,
        "email": f"r{position}@example.com",
        "name": f"R {position}",
        "subject": f"Hello {position}",
        "text": f"Body {position}",
        "html": None,
        "send_at": send_at or T0 + timedelta(minutes=position),
        "token": f"tok{position}",
    }
    values.update(kw)
    return Task(**values)


def with_tasks(store: TaskStore, cid: str = "c1", count: int = 10) -> list[Task]:
    """A campaign ``cid`` with ``count`` Pending tasks, one a minute from T0."""
    store.create_campaign(campaign(cid), recipients(count))
    tasks = [make_task(cid, i) for i in range(count)]
    assert store.insert_tasks(tasks, at=T0) == count
    return tasks


def all_changes(
    store: TaskStore, campaign_id: str | None = None, *, after: int = 0
) -> list[ChangeLogEntry]:
    out: list[ChangeLogEntry] = []
    while page := store.changes_after(after, campaign_id=campaign_id, limit=500):
        out.extend(page)
        after = page[-1].id
    return out


def drive(store: TaskStore, tid: str, target: TaskState, at: datetime = T0) -> None:
    """Move a Pending task to ``target`` (Pending, Running or Failed) along legal transitions."""
    if target is S.PENDING:
        return
    assert store.transition(tid, S.PENDING, S.RUNNING, at=at, changes={"claimed_at": at})
    if target is S.FAILED:
        assert store.transition(tid, S.RUNNING, S.FAILED, at=at, changes={"error": "boom"})


def is_utc(value: datetime) -> bool:
    return value.tzinfo is not None and value.utcoffset() == timedelta(0)


# --- campaigns --------------------------------------------------------------------------------


def test_create_and_get_campaign_round_trips(store: TaskStore) -> None:
    original = campaign(checkpoint={"after": 3, "nested": {"k": [1, 2]}}, state_reason="why")
    store.create_campaign(original, recipients(3))

    got = store.get_campaign("c1")

    assert got == replace(original, recipient_count=3)
    assert got.policy == original.policy
    assert got.policy.describe() == original.policy.describe()


def test_recipient_count_is_the_number_of_recipients(store: TaskStore) -> None:
    store.create_campaign(campaign(recipient_count=99), recipients(4))
    assert store.get_campaign("c1").recipient_count == 4


def test_list_campaigns_newest_first(store: TaskStore) -> None:
    assert store.list_campaigns() == []
    store.create_campaign(campaign("ca", created_at=T0), [])
    store.create_campaign(campaign("cc", created_at=T0 + timedelta(hours=2)), [])
    store.create_campaign(campaign("cb", created_at=T0 + timedelta(hours=1)), [])

    assert [c.id for c in store.list_campaigns()] == ["cc", "cb", "ca"]


def test_create_campaign_with_existing_id_conflicts(store: TaskStore) -> None:
    store.create_campaign(campaign(name="first"), recipients(2))

    with pytest.raises(Conflict):
        store.create_campaign(campaign(name="second"), recipients(5))

    assert store.get_campaign("c1").name == "first"
    assert len(store.list_recipients("c1")) == 2


def test_create_campaign_is_all_or_nothing(store: TaskStore) -> None:
    rows = recipients(1200)
    # A bad row deep in the list, after whole chunks went in.
    rows[900] = replace(rows[900], position=100)

    with pytest.raises(InvalidField) as info:
        store.create_campaign(campaign(), rows)

    assert info.value.field == "position"
    with pytest.raises(NotFound):
        store.get_campaign("c1")
    assert store.list_campaigns() == []
    assert store.last_change_id() == 0
    # Nothing left behind: the same id and positions go in cleanly now.
    store.create_campaign(campaign(), recipients(1200))
    assert len(store.list_recipients("c1", limit=5000)) == 1200


def test_create_campaign_consumes_a_one_pass_iterator(store: TaskStore) -> None:
    # A generator can be read only once: the store must not need len() or a second pass.
    store.create_campaign(campaign(recipient_count=0), (r for r in recipients(1200)))

    assert store.get_campaign("c1").recipient_count == 1200
    assert [r.position for r in store.list_recipients("c1", limit=5000)] == list(range(1200))


def test_create_campaign_from_a_failing_iterator_stores_nothing(store: TaskStore) -> None:
    class Broken(Exception):
        pass

    def rows() -> Iterator[Recipient]:
        yield from recipients(1100)
        raise Broken("the import failed after whole chunks went in")

    with pytest.raises(Broken):
        store.create_campaign(campaign(), rows())

    with pytest.raises(NotFound):
        store.get_campaign("c1")
    assert store.list_campaigns() == []
    assert store.last_change_id() == 0
    store.create_campaign(campaign(), iter(recipients(3)))
    assert store.get_campaign("c1").recipient_count == 3


def test_create_campaign_refuses_a_repeated_position_from_an_iterator(store: TaskStore) -> None:
    rows = recipients(1200)
    rows[1100] = replace(rows[1100], position=7)

    with pytest.raises(InvalidField) as info:
        store.create_campaign(campaign(), iter(rows))

    assert info.value.field == "position"
    assert store.list_campaigns() == []


def test_unknown_campaign_raises_not_found(store: TaskStore) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.get_campaign("nope"),
        lambda: store.set_campaign_state(
            "nope", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0
        ),
        lambda: store.save_checkpoint("nope", {"a": 1}, at=T0),
        lambda: store.list_recipients("nope"),
        lambda: store.list_tasks("nope"),
        lambda: store.count_tasks("nope"),
        lambda: store.transition_all("nope", S.PENDING, S.CANCELLED, at=T0),
        lambda: store.insert_tasks([make_task("nope", 0)], at=T0),
    ]
    for call in calls:
        with pytest.raises(NotFound) as info:
            call()
        assert (info.value.kind, info.value.ident) == ("campaign", "nope")
    assert store.get_task(task_id("nope", 0)) is None
    assert store.last_change_id() == 0


def test_set_campaign_state_is_compare_and_set_and_logged(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    later = T0 + timedelta(minutes=5)

    assert store.set_campaign_state(
        "c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=later, reason="go"
    )
    # The state moved on, so the same compare-and-set no longer applies, and logs nothing.
    assert not store.set_campaign_state(
        "c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=later
    )
    assert store.set_campaign_state(
        "c1",
        {CampaignState.DRAFT, CampaignState.PROVISIONING, CampaignState.ACTIVE},
        CampaignState.CANCELLED,
        at=later,
        reason="user",
    )

    got = store.get_campaign("c1")
    assert (got.state, got.state_reason, got.updated_at) == (
        CampaignState.CANCELLED,
        "user",
        later,
    )
    assert [(e.task_id, e.from_state, e.to_state, e.note, e.at) for e in all_changes(store)] == [
        (None, "draft", "provisioning", "go", later),
        (None, "provisioning", "cancelled", "user", later),
    ]


def test_set_campaign_state_refuses_illegal_transitions(store: TaskStore) -> None:
    store.create_campaign(campaign(state=CampaignState.CANCELLED), [])

    with pytest.raises(IllegalTransition):
        store.set_campaign_state("c1", {CampaignState.CANCELLED}, CampaignState.ACTIVE, at=T0)
    with pytest.raises(IllegalTransition):
        store.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.COMPLETED, at=T0)

    assert store.get_campaign("c1").state is CampaignState.CANCELLED
    assert store.last_change_id() == 0


def test_save_checkpoint(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    later = T0 + timedelta(minutes=1)

    store.save_checkpoint("c1", {"after": 499, "done": [1, 2]}, at=later)
    assert store.last_change_id() == 0
    store.save_checkpoint("c1", {"after": 999}, at=later, note="1000 of 2000 tasks")

    got = store.get_campaign("c1")
    assert got.checkpoint == {"after": 999}
    assert got.updated_at == later
    [entry] = all_changes(store)
    assert (entry.campaign_id, entry.task_id, entry.to_state, entry.note) == (
        "c1",
        None,
        "progress",
        "1000 of 2000 tasks",
    )

    store.save_checkpoint("c1", None, at=later)
    assert store.get_campaign("c1").checkpoint is None


def test_returned_mappings_are_not_the_stored_ones(store: TaskStore) -> None:
    checkpoint: dict[str, Any] = {"after": 1}
    store.create_campaign(campaign(checkpoint=checkpoint), recipients(1))
    checkpoint["after"] = 2
    got = store.get_campaign("c1")
    assert got.checkpoint is not None
    got.checkpoint["after"] = 3  # type: ignore[index]
    variables = store.list_recipients("c1")[0].variables
    variables["n"] = "changed"  # type: ignore[index]

    assert store.get_campaign("c1").checkpoint == {"after": 1}
    assert store.list_recipients("c1")[0].variables == {"n": "0"}


# --- recipients -------------------------------------------------------------------------------


def test_list_recipients_pages_by_position(store: TaskStore) -> None:
    rows = recipients(25)
    store.create_campaign(campaign(), list(reversed(rows)))

    pages: list[list[Recipient]] = []
    after = -1
    while page := store.list_recipients("c1", after=after, limit=10):
        pages.append(page)
        after = page[-1].position

    assert [len(p) for p in pages] == [10, 10, 5]
    assert [r for p in pages for r in p] == rows
    assert store.list_recipients("c1", after=24) == []


# --- inserting tasks --------------------------------------------------------------------------


def test_insert_tasks_is_idempotent_and_logs_each_insert_once(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(15))
    first = [make_task("c1", i) for i in range(10)]
    assert store.insert_tasks(first, at=T0) == 10

    later = T0 + timedelta(hours=1)
    again = [replace(t, token="other", subject="changed") for t in first]
    more = [make_task("c1", i) for i in range(10, 15)]
    assert store.insert_tasks(again + more, at=later) == 5
    assert store.insert_tasks(again + more, at=later) == 0

    # Existing tasks were left untouched.
    assert store.get_task(first[0].id) == replace(
        first[0], created_at=T0, updated_at=T0, planned_at=first[0].send_at
    )
    entries = all_changes(store)
    assert [(e.task_id, e.from_state, e.to_state) for e in entries] == [
        (t.id, None, "Pending") for t in first + more
    ]
    assert [e.at for e in entries] == [T0] * 10 + [later] * 5
    assert store.count_tasks("c1")[S.PENDING] == 15


def test_insert_tasks_skips_a_second_task_for_a_taken_position(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(1))
    assert store.insert_tasks([make_task("c1", 0)], at=T0) == 1
    assert store.insert_tasks([make_task("c1", 0, id="c1-other")], at=T0) == 0
    assert store.get_task("c1-other") is None
    assert store.insert_tasks([], at=T0) == 0


def test_insert_tasks_refuses_tasks_that_are_not_pending(store: TaskStore) -> None:
    store.create_campaign(campaign(), recipients(2))
    with pytest.raises(IllegalTransition):
        store.insert_tasks([make_task("c1", 0), make_task("c1", 1, state=S.FINISHED)], at=T0)
    assert store.get_task(task_id("c1", 0)) is None
    assert store.last_change_id() == 0


def test_bulk_insert_of_twenty_thousand_tasks(backend: Backend, store: TaskStore) -> None:
    count = backend.bulk_tasks
    store.create_campaign(campaign(), [])
    tasks = [make_task("c1", i, send_at=T0 + timedelta(seconds=i)) for i in range(count)]

    assert store.insert_tasks(tasks, at=T0) == count

    assert store.count_tasks("c1")[S.PENDING] == count
    created = store.changes_after(0, limit=count + 1)
    assert [(e.task_id, e.to_state) for e in created] == [(t.id, "Pending") for t in tasks]
    assert store.last_change_id() == created[-1].id
    assert store.transition_all("c1", S.PENDING, S.CANCELLED, at=T0) == count
    assert store.count_tasks("c1")[S.CANCELLED] == count
    # Ids are strictly increasing, not dense (PostgreSQL's encode the writing transaction).
    cancelled = store.changes_after(created[-1].id, limit=count + 1)
    assert len(cancelled) == count
    tail = store.changes_after(cancelled[-3].id)
    assert [(e.task_id, e.to_state) for e in tail] == [
        (task_id("c1", count - 2), "Cancelled"),
        (task_id("c1", count - 1), "Cancelled"),
    ]
    assert store.last_change_id() == tail[-1].id


# --- transitions ------------------------------------------------------------------------------


def test_every_legal_transition_applies_and_is_logged(store: TaskStore) -> None:
    pairs = list(TASK_TRANSITIONS)
    with_tasks(store, count=len(pairs))
    at = T0 + timedelta(minutes=30)

    for position, (source, target) in enumerate(pairs):
        tid = task_id("c1", position)
        drive(store, tid, source)
        before = store.last_change_id()

        moved = store.transition(tid, source, target, at=at, note=f"{source}->{target}")

        assert moved is not None
        assert (moved.state, moved.updated_at) == (target, at)
        assert store.get_task(tid) == moved
        [entry] = store.changes_after(before)
        assert (entry.campaign_id, entry.task_id, entry.from_state, entry.to_state) == (
            "c1",
            tid,
            source.value,
            target.value,
        )
        assert (entry.at, entry.note) == (at, f"{source}->{target}")


def test_transition_is_compare_and_set(store: TaskStore) -> None:
    [task, *_] = with_tasks(store, count=2)
    before = store.last_change_id()

    assert store.transition(task.id, S.RUNNING, S.FINISHED, at=T0) is None
    assert store.transition("no-such-task", S.PENDING, S.RUNNING, at=T0) is None
    assert store.transition(task.id, S.PENDING, S.RUNNING, at=T0) is not None
    assert store.transition(task.id, S.PENDING, S.RUNNING, at=T0) is None
    assert store.transition(task.id, S.PENDING, S.CANCELLED, at=T0) is None

    current = store.get_task(task.id)
    assert current is not None
    assert current.state is S.RUNNING
    # Only the one transition that applied was logged.
    assert [(e.from_state, e.to_state) for e in store.changes_after(before)] == [
        ("Pending", "Running")
    ]


def test_illegal_transitions_raise_and_change_nothing(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    before = store.last_change_id()

    for source in TaskState:
        for target in TaskState:
            if (source, target) in TASK_TRANSITIONS:
                continue
            with pytest.raises(IllegalTransition):
                store.transition(task.id, source, target, at=T0)
            with pytest.raises(IllegalTransition):
                store.transition_all("c1", source, target, at=T0)

    assert store.get_task(task.id) == replace(
        task, created_at=T0, updated_at=T0, planned_at=task.send_at
    )
    assert store.last_change_id() == before


def test_transition_applies_changes(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    claimed = T0 + timedelta(seconds=1)
    sent = T0 + timedelta(seconds=2)

    running = store.transition(
        task.id, S.PENDING, S.RUNNING, at=claimed, changes={"claimed_at": claimed, "attempts": 1}
    )
    assert running is not None
    assert (running.claimed_at, running.attempts, running.token) == (claimed, 1, task.token)

    done = store.transition(
        task.id,
        S.RUNNING,
        S.FINISHED,
        at=sent,
        changes={"sent_at": sent, "message_id": "<m1@example.com>", "error": None},
    )
    assert done is not None
    assert (done.state, done.sent_at, done.message_id, done.error) == (
        S.FINISHED,
        sent,
        "<m1@example.com>",
        None,
    )
    assert (done.claimed_at, done.attempts, done.created_at, done.updated_at) == (
        claimed,
        1,
        T0,
        sent,
    )
    assert store.get_task(task.id) == done


def test_transition_back_to_pending_can_reschedule(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    drive(store, task.id, S.RUNNING)
    retry_at = T0 + timedelta(minutes=10)

    back = store.transition(
        task.id,
        S.RUNNING,
        S.PENDING,
        at=T0,
        changes={"send_at": retry_at, "token": "retry1", "claimed_at": None, "error": "451"},
    )

    assert back is not None
    assert (back.state, back.send_at, back.token, back.claimed_at, back.error) == (
        S.PENDING,
        retry_at,
        "retry1",
        None,
        "451",
    )


def test_transition_refuses_unknown_change_fields(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    with pytest.raises(InvalidField):
        store.transition(task.id, S.PENDING, S.RUNNING, at=T0, changes={"state": "x"})  # type: ignore[arg-type]
    current = store.get_task(task.id)
    assert current is not None
    assert current.state is S.PENDING


def test_transition_all_moves_every_matching_task_and_logs_each(store: TaskStore) -> None:
    tasks = with_tasks(store, "c1", count=10)
    with_tasks(store, "c2", count=3)
    for t in tasks[:3]:
        drive(store, t.id, S.RUNNING)
    before = store.last_change_id()
    at = T0 + timedelta(hours=1)

    assert store.transition_all("c1", S.PENDING, S.CANCELLED, at=at, note="cancel") == 7

    entries = store.changes_after(before)
    assert [(e.task_id, e.from_state, e.to_state, e.note, e.at) for e in entries] == [
        (t.id, "Pending", "Cancelled", "cancel", at) for t in tasks[3:]
    ]
    counts = store.count_tasks("c1")
    assert (counts[S.RUNNING], counts[S.CANCELLED], counts[S.PENDING]) == (3, 7, 0)
    assert store.count_tasks("c2")[S.PENDING] == 3
    cancelled = store.get_task(tasks[5].id)
    assert cancelled is not None
    assert cancelled.updated_at == at
    # Nothing left to move: nothing logged.
    assert store.transition_all("c1", S.PENDING, S.CANCELLED, at=at) == 0
    assert store.last_change_id() == entries[-1].id


def test_reschedule_moves_pending_tasks_holding_the_token_and_logs_each(
    store: TaskStore,
) -> None:
    tasks = with_tasks(store, count=5)
    drive(store, tasks[1].id, S.RUNNING)
    drive(store, tasks[2].id, S.FAILED)
    before = store.last_change_id()
    new_time = T0 + timedelta(days=1)
    at = T0 + timedelta(hours=1)
    moves = [
        Move(t.id, t.token, new_time + timedelta(minutes=i), f"new{i}") for i, t in enumerate(tasks)
    ]
    moves[4] = moves[4]._replace(token="not-the-current-token")

    updated = store.reschedule(
        [*moves, Move("no-such-task", "x", new_time, "y")], at=at, reason="worker down"
    )

    assert updated == 2
    got = [store.get_task(t.id) for t in tasks]
    assert [(g.send_at, g.token, g.moves, g.moved_reason) for g in got if g] == [
        (new_time, "new0", 1, "worker down"),
        (tasks[1].send_at, tasks[1].token, 0, None),
        (tasks[2].send_at, tasks[2].token, 0, None),
        (new_time + timedelta(minutes=3), "new3", 1, "worker down"),
        (tasks[4].send_at, tasks[4].token, 0, None),
    ]
    assert got[0] is not None
    assert got[0].updated_at == at
    # the first planned instant stays
    assert got[0].planned_at == tasks[0].send_at
    assert [
        (e.task_id, e.from_state, e.to_state, e.note, e.at) for e in store.changes_after(before)
    ] == [
        (tasks[0].id, "Pending", "Pending", "moved: worker down", at),
        (tasks[3].id, "Pending", "Pending", "moved: worker down", at),
    ]
    # a second move counts again; the old token no longer matches
    assert store.reschedule([moves[0]], at=at, reason="again") == 0
    again = Move(tasks[0].id, "new0", new_time, "newer")
    assert store.reschedule([again], at=at, reason="again") == 1
    moved = store.get_task(tasks[0].id)
    assert moved is not None
    assert (moved.moves, moved.moved_reason, moved.token) == (2, "again", "newer")
    assert store.reschedule([], at=at, reason="nothing") == 0


def test_new_tasks_are_planned_at_their_send_time_and_never_moved(store: TaskStore) -> None:
    tasks = with_tasks(store, count=2)
    for task in tasks:
        got = store.get_task(task.id)
        assert got is not None
        assert got.planned_at == task.send_at
        assert (got.moves, got.moved_reason) == (0, None)
        [listed] = [t for t in store.list_tasks("c1") if t.id == task.id]
        assert listed.planned_at == task.send_at


def test_transition_can_count_a_move(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    drive(store, task.id, S.RUNNING)
    later = T0 + timedelta(days=1)
    back = store.transition(
        task.id, S.RUNNING, S.PENDING, at=T0,
        changes={"send_at": later, "token": "t2", "moves": 1, "moved_reason": "transient: 421"},
    )  # fmt: skip
    assert back is not None
    got = store.get_task(task.id)
    assert got is not None
    assert (got.send_at, got.moves, got.moved_reason) == (later, 1, "transient: 421")
    assert got.planned_at == task.send_at


def test_get_tasks_reads_many_by_id_as_get_task_does(backend: Backend, store: TaskStore) -> None:
    """More ids than one DynamoDB BatchGetItem takes (100), unknown and repeated ids among
    them, and changes made through another handle just before: each found task as current
    as ``get_task`` reads it, the unknown ones left out."""
    tasks = with_tasks(store, count=250)
    other = backend.handle()
    for task in tasks[::7]:
        drive(other, task.id, S.RUNNING)
    wanted = [t.id for t in reversed(tasks)] + [tasks[3].id, "c1-nope", task_id("c2", 0)]
    got = store.get_tasks(wanted)
    assert sorted(got) == sorted(t.id for t in tasks)
    assert got == {t.id: store.get_task(t.id) for t in tasks}
    assert {tid for tid, t in got.items() if t.state is S.RUNNING} == {t.id for t in tasks[::7]}
    assert store.get_tasks([]) == {}
    assert store.get_tasks(["c1-nope"]) == {}


def test_booked_lists_sent_claimed_and_planned_instants(store: TaskStore) -> None:
    tasks = with_tasks(store, count=6)
    with_tasks(store, "c2", count=2)  # another campaign's sends are not booked
    sent_at = T0 + timedelta(minutes=30)
    drive(store, tasks[0].id, S.RUNNING, at=T0 + timedelta(minutes=20))
    store.transition(tasks[0].id, S.RUNNING, S.FINISHED, at=sent_at, changes={"sent_at": sent_at})
    drive(store, tasks[1].id, S.RUNNING, at=T0 + timedelta(minutes=40))
    drive(store, tasks[2].id, S.FAILED)
    store.transition(tasks[3].id, S.PENDING, S.CANCELLED, at=T0)
    # tasks 4 and 5 stay Pending, at T0+4min and T0+5min

    got = store.booked("c1", since=T0)
    assert sorted(got) == sorted(
        [
            (S.FINISHED, sent_at),
            (S.RUNNING, T0 + timedelta(minutes=40)),
            (S.PENDING, tasks[4].send_at),
            (S.PENDING, tasks[5].send_at),
        ]
    )
    assert all(is_utc(when) for _, when in got)
    # [since, until): the Pending ones at 4 and 5 minutes only
    window = store.booked("c1", since=T0 + timedelta(minutes=4), until=T0 + timedelta(minutes=30))
    assert sorted(window) == [(S.PENDING, tasks[4].send_at), (S.PENDING, tasks[5].send_at)]
    assert store.booked("c1", since=T0 + timedelta(hours=1)) == []
    assert store.booked("no-such-campaign", since=T0) == []


def test_count_moves_counts_moved_and_late_tasks(store: TaskStore) -> None:
    tasks = with_tasks(store, count=5)
    with_tasks(store, "c2", count=1)
    assert store.count_moves("c1", late_after=60) == (0, 0)
    store.reschedule([Move(tasks[0].id, tasks[0].token, T0, "n0")], at=T0, reason="r")
    for task, late_by in ((tasks[1], 61), (tasks[2], 30), (tasks[3], 60)):
        drive(store, task.id, S.RUNNING)
        sent = task.send_at + timedelta(seconds=late_by)
        store.transition(task.id, S.RUNNING, S.FINISHED, at=sent, changes={"sent_at": sent})
    assert store.count_moves("c1", late_after=60) == (1, 1)
    assert store.count_moves("c1", late_after=10) == (1, 3)
    assert store.count_moves("c2", late_after=60) == (0, 0)
    assert store.count_moves("no-such-campaign", late_after=60) == (0, 0)


# --- queries ----------------------------------------------------------------------------------


def test_list_tasks_pages_with_state_filter_and_search(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    emails = {
        3: "a%b@example.com",
        4: "a_b@example.com",
        5: "axb@example.com",
        6: "aXYb@example.com",
        7: "Mixed.Case@Example.COM",
        8: "back\\slash@example.com",
    }
    tasks = [make_task("c1", i, email=emails.get(i, f"r{i}@example.org")) for i in range(30)]
    store.insert_tasks(list(reversed(tasks)), at=T0)
    for t in tasks[::3]:
        drive(store, t.id, S.RUNNING)

    def pages(**kw: Any) -> list[list[Task]]:
        out: list[list[Task]] = []
        after = -1
        while page := store.list_tasks("c1", after=after, limit=4, **kw):
            out.append(page)
            after = page[-1].position
        return out

    every = pages()
    assert [len(p) for p in every] == [4] * 7 + [2]
    assert [t.position for p in every for t in p] == list(range(30))

    running = pages(state=S.RUNNING)
    assert [t.position for p in running for t in p] == list(range(0, 30, 3))
    assert all(t.state is S.RUNNING for p in running for t in p)

    def found(search: str, state: TaskState | None = None) -> list[int]:
        return [t.position for p in pages(search=search, state=state) for t in p]

    assert found("a%b") == [3]
    assert found("a_b") == [4]
    assert found("%") == [3]
    assert found("_") == [4]
    assert found("\\") == [8]
    assert found("mixed.case@EXAMPLE") == [7]
    assert found("@example.org") == [i for i in range(30) if i not in emails]
    assert found("@example.org", S.PENDING) == [i for i in range(30) if i not in emails and i % 3]
    assert found("nobody") == []


def test_due_tasks_in_send_order_with_cursor(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    same = T0 + timedelta(minutes=5)
    tasks = [
        make_task("c1", 0, send_at=T0 + timedelta(minutes=9)),
        make_task("c1", 1, send_at=same, id="c1-b"),
        make_task("c1", 2, send_at=same, id="c1-a"),
        make_task("c1", 3, send_at=T0 + timedelta(minutes=1)),
        make_task("c1", 4, send_at=T0 + timedelta(minutes=20)),
        make_task("c1", 5, send_at=same, id="c1-c"),
        make_task("c1", 6, send_at=T0 + timedelta(minutes=2)),
    ]
    store.insert_tasks(tasks, at=T0)
    drive(store, task_id("c1", 6), S.RUNNING)
    before = T0 + timedelta(minutes=20)  # exclusive: position 4 is not due

    due = store.due_tasks(S.PENDING, before=before)
    expected = [task_id("c1", 3), "c1-a", "c1-b", "c1-c", task_id("c1", 0)]
    assert [t.id for t in due] == expected

    paged: list[str] = []
    cursor: tuple[datetime, str] | None = None
    while page := store.due_tasks(S.PENDING, before=before, after=cursor, limit=2):
        paged.extend(t.id for t in page)
        cursor = (page[-1].send_at, page[-1].id)
    assert paged == expected
    assert [t.id for t in store.due_tasks(S.RUNNING, before=before)] == [task_id("c1", 6)]


def test_stale_running_oldest_claim_first(store: TaskStore) -> None:
    tasks = with_tasks(store, count=5)
    claims = {0: 30, 1: 10, 2: 20, 4: 50}
    for position, minutes in claims.items():
        at = T0 + timedelta(minutes=minutes)
        store.transition(
            tasks[position].id, S.PENDING, S.RUNNING, at=at, changes={"claimed_at": at}
        )

    stale = store.stale_running(claimed_before=T0 + timedelta(minutes=50))
    assert [t.position for t in stale] == [1, 2, 0]
    first_two = store.stale_running(claimed_before=T0 + timedelta(hours=1), limit=2)
    assert [t.position for t in first_two] == [1, 2]
    assert store.stale_running(claimed_before=T0 + timedelta(minutes=10)) == []


def test_campaign_state_reads_the_current_state(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    assert store.campaign_state("c1") is CampaignState.DRAFT
    store.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0)
    assert store.campaign_state("c1") is CampaignState.PROVISIONING
    with pytest.raises(NotFound):
        store.campaign_state("nope")


def test_has_unfinished_tasks_sees_pending_and_running_only(store: TaskStore) -> None:
    assert store.has_unfinished_tasks("nope") is False
    tasks = with_tasks(store, "c1", count=3)
    assert store.has_unfinished_tasks("c1") is True
    drive(store, tasks[0].id, S.RUNNING)
    store.transition(tasks[0].id, S.RUNNING, S.FINISHED, at=T0)
    drive(store, tasks[1].id, S.RUNNING)
    store.transition(tasks[2].id, S.PENDING, S.CANCELLED, at=T0)
    assert store.has_unfinished_tasks("c1") is True  # one is Running
    store.transition(tasks[1].id, S.RUNNING, S.FAILED, at=T0)
    assert store.has_unfinished_tasks("c1") is False


def test_count_tasks_has_every_state(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    assert store.count_tasks("c1") == dict.fromkeys(TaskState, 0)

    tasks = with_tasks(store, "c2", count=6)
    drive(store, tasks[0].id, S.RUNNING)
    drive(store, tasks[1].id, S.FAILED)
    drive(store, tasks[2].id, S.RUNNING)
    store.transition(tasks[2].id, S.RUNNING, S.FINISHED, at=T0)
    store.transition(tasks[3].id, S.PENDING, S.CANCELLED, at=T0)

    assert store.count_tasks("c2") == {
        S.PENDING: 2,
        S.RUNNING: 1,
        S.FINISHED: 1,
        S.FAILED: 1,
        S.CANCELLED: 1,
    }
    assert store.count_tasks("c1") == dict.fromkeys(TaskState, 0)


# --- change log -------------------------------------------------------------------------------


def test_changes_after_filters_and_limits(store: TaskStore) -> None:
    assert store.last_change_id() == store.newest_change_id() == 0
    assert store.changes_after(0) == []
    a = with_tasks(store, "ca", count=3)
    b = with_tasks(store, "cb", count=2)
    drive(store, a[0].id, S.RUNNING)

    everything = store.changes_after(0)
    ids = [e.id for e in everything]
    assert len(ids) == 6
    assert ids == sorted(ids)
    assert len(set(ids)) == 6
    assert store.last_change_id() == ids[-1]
    assert store.newest_change_id() == ids[-1]  # nothing in flight: nothing held back

    assert [e.id for e in store.changes_after(ids[1], limit=2)] == ids[2:4]
    assert [e.id for e in store.changes_after(ids[-1])] == []
    only_b = store.changes_after(0, campaign_id="cb")
    assert [e.task_id for e in only_b] == [t.id for t in b]
    only_a = store.changes_after(ids[0], campaign_id="ca", limit=2)
    assert [(e.task_id, e.to_state) for e in only_a] == [(a[1].id, "Pending"), (a[2].id, "Pending")]
    assert store.changes_after(0, campaign_id="unknown") == []


# --- leases -----------------------------------------------------------------------------------


def test_leases_acquire_renew_contend_expire_release(store: TaskStore) -> None:
    ttl = 60.0
    assert store.acquire_lease("reconciler", "a", ttl_seconds=ttl, at=T0)
    assert not store.acquire_lease(
        "reconciler", "b", ttl_seconds=ttl, at=T0 + timedelta(seconds=30)
    )
    # Renewal by the owner extends the lease.
    assert store.acquire_lease("reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=50))
    assert not store.acquire_lease(
        "reconciler", "b", ttl_seconds=ttl, at=T0 + timedelta(seconds=100)
    )
    # Other names are independent.
    assert store.acquire_lease("other", "b", ttl_seconds=ttl, at=T0)
    # Expired (at the very instant it ends): free for anyone.
    assert store.acquire_lease("reconciler", "b", ttl_seconds=ttl, at=T0 + timedelta(seconds=110))
    assert not store.acquire_lease(
        "reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=111)
    )
    # Only the owner can release.
    store.release_lease("reconciler", "a")
    assert not store.acquire_lease(
        "reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=112)
    )
    store.release_lease("reconciler", "b")
    assert store.acquire_lease("reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=113))
    store.release_lease("never-taken", "a")
    with pytest.raises(InvalidField):
        store.acquire_lease("x", "a", ttl_seconds=0, at=T0)


# --- counters ---------------------------------------------------------------------------------


def test_counters_start_at_zero_count_up_and_are_shared_by_handles(backend: Backend) -> None:
    one, other = backend.handle(), backend.handle()
    assert one.counter("session-generation") == 0
    assert one.increment_counter("session-generation") == 1
    assert other.counter("session-generation") == 1  # another handle (process) sees it at once
    assert other.increment_counter("session-generation") == 2
    assert one.counter("session-generation") == 2
    assert one.counter("other") == 0  # names are independent
    for bad in ("", "x" * 201):
        with pytest.raises(InvalidField) as caught:
            one.counter(bad)
        assert caught.value.field == "name"
        with pytest.raises(InvalidField):
            one.increment_counter(bad)


def test_concurrent_increments_all_count(backend: Backend) -> None:
    handles = [backend.handle() for _ in range(4)]
    barrier = threading.Barrier(len(handles))
    seen: list[int] = []
    lock = threading.Lock()

    def bump(store: TaskStore) -> None:
        barrier.wait()
        for _ in range(5):
            value = store.increment_counter("c")
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=bump, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Every increment returned its own new value: none lost, none repeated.
    assert sorted(seen) == list(range(1, 21))
    assert handles[0].counter("c") == 20


# --- time -------------------------------------------------------------------------------------


def test_datetimes_round_trip_as_aware_utc(store: TaskStore) -> None:
    plus_five_thirty = timezone(timedelta(hours=5, minutes=30))
    local = datetime(2026, 12, 1, 14, 45, 7, 123456, tzinfo=plus_five_thirty)
    store.create_campaign(campaign(created_at=local), [])
    store.insert_tasks([make_task("c1", 0, send_at=local)], at=local)
    store.transition(
        task_id("c1", 0), S.PENDING, S.RUNNING, at=local, changes={"claimed_at": local}
    )
    store.acquire_lease("l", "a", ttl_seconds=1, at=local)

    got_campaign = store.get_campaign("c1")
    task = store.get_task(task_id("c1", 0))
    assert task is not None
    values = [
        got_campaign.created_at,
        got_campaign.updated_at,
        task.send_at,
        task.claimed_at,
        task.created_at,
        task.updated_at,
        *(e.at for e in all_changes(store)),
    ]
    for value in values:
        assert value is not None
        assert is_utc(value), value
        assert value == local
        assert value.microsecond == 123456
    assert task.send_at == datetime(2026, 12, 1, 9, 15, 7, 123456, tzinfo=UTC)
    just_after = local + timedelta(microseconds=1)
    assert [t.id for t in store.due_tasks(S.RUNNING, before=just_after)] == [task.id]
    assert store.due_tasks(S.RUNNING, before=local) == []
    # The lease ends one second after ``local``, whatever zone the caller uses.
    lease_ends = datetime(2026, 12, 1, 9, 15, 8, 123456, tzinfo=UTC)
    assert not store.acquire_lease(
        "l", "b", ttl_seconds=1, at=lease_ends - timedelta(microseconds=1)
    )
    assert store.acquire_lease("l", "b", ttl_seconds=1, at=lease_ends)


def test_naive_datetimes_are_refused(store: TaskStore) -> None:
    [task] = with_tasks(store, count=1)
    naive = datetime(2026, 12, 1, 9, 0)
    with pytest.raises(ValueError, match="naive"):
        store.transition(task.id, S.PENDING, S.RUNNING, at=naive)
    with pytest.raises(ValueError, match="naive"):
        store.insert_tasks([make_task("c1", 1, send_at=naive)], at=T0)
    current = store.get_task(task.id)
    assert current is not None
    assert current.state is S.PENDING
    assert store.get_task(task_id("c1", 1)) is None


# --- failures ---------------------------------------------------------------------------------


def test_unreachable_backend_raises_store_unavailable(backend: Backend) -> None:
    store = backend.unreachable()
    calls: list[Callable[[], object]] = [
        lambda: store.create_campaign(campaign(), recipients(1)),
        lambda: store.get_campaign("c1"),
        lambda: store.list_campaigns(),
        lambda: store.set_campaign_state(
            "c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0
        ),
        lambda: store.save_checkpoint("c1", None, at=T0),
        lambda: store.list_recipients("c1"),
        lambda: store.insert_tasks([make_task("c1", 0)], at=T0),
        lambda: store.get_task("t"),
        lambda: store.get_tasks(["t"]),
        lambda: store.transition("t", S.PENDING, S.RUNNING, at=T0),
        lambda: store.transition_all("c1", S.PENDING, S.CANCELLED, at=T0),
        lambda: store.reschedule([Move("t", "x", T0, "y")], at=T0, reason="r"),
        lambda: store.booked("c1", since=T0),
        lambda: store.count_moves("c1", late_after=60),
        lambda: store.list_tasks("c1"),
        lambda: store.due_tasks(S.PENDING, before=T0),
        lambda: store.stale_running(claimed_before=T0),
        lambda: store.count_tasks("c1"),
        lambda: store.changes_after(0),
        lambda: store.last_change_id(),
        lambda: store.acquire_lease("l", "a", ttl_seconds=1, at=T0),
        lambda: store.release_lease("l", "a"),
        lambda: store.counter("c"),
        lambda: store.increment_counter("c"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()
    # The lifecycle is checked before the backend is touched.
    with pytest.raises(IllegalTransition):
        store.transition("t", S.FINISHED, S.PENDING, at=T0)


# --- concurrency ------------------------------------------------------------------------------


def race(claimers: list[TaskStore], tid: str) -> list[object]:
    """Let every claimer try Pending -> Running on ``tid`` at the same moment."""
    barrier = threading.Barrier(len(claimers))
    results: list[object] = [None] * len(claimers)

    def claim(i: int) -> None:
        barrier.wait()
        try:
            results[i] = claimers[i].transition(
                tid, S.PENDING, S.RUNNING, at=T0, changes={"claimed_at": T0}
            )
        except BaseException as exc:  # reported by the caller, with the round
            results[i] = exc

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(claimers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_claimers_race_and_exactly_one_wins(backend: Backend) -> None:
    rounds = 50
    setup = backend.handle()
    with_tasks(setup, count=rounds)
    claimers = [backend.handle(), backend.handle()]

    for position in range(rounds):
        results = race(claimers, task_id("c1", position))
        assert not [r for r in results if isinstance(r, BaseException)], (position, results)
        assert len([r for r in results if isinstance(r, Task)]) == 1, (position, results)

    entries = all_changes(setup)
    claims = [e.task_id for e in entries if e.to_state == "Running"]
    assert sorted(claims, key=str) == sorted(task_id("c1", p) for p in range(rounds))
    assert setup.count_tasks("c1")[S.RUNNING] == rounds


def test_concurrent_inserts_of_the_same_tasks_insert_each_once(backend: Backend) -> None:
    count = 2000
    setup = backend.handle()
    setup.create_campaign(campaign(), [])
    tasks = [make_task("c1", i) for i in range(count)]
    orders = [tasks, list(reversed(tasks)), tasks[count // 2 :] + tasks[: count // 2]]
    handles = [backend.handle() for _ in orders]
    barrier = threading.Barrier(len(orders))
    results: list[object] = [None] * len(orders)

    def insert(i: int) -> None:
        barrier.wait()
        try:
            results[i] = handles[i].insert_tasks(orders[i], at=T0)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(len(orders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert all(isinstance(r, int) for r in results), results
    assert sum(r for r in results if isinstance(r, int)) == count
    entries = all_changes(setup)
    assert sorted(e.task_id or "" for e in entries) == sorted(t.id for t in tasks)
    assert setup.count_tasks("c1")[S.PENDING] == count


def test_change_log_ids_become_visible_in_order(backend: Backend) -> None:
    """A reader tailing ``changes_after`` under concurrent writers sees every id once, no gaps.

    On PostgreSQL ids are drawn at INSERT and may commit out of order; the store must not hand
    out an id while one below it may still commit, or the tailing reader steps past it. One
    writer changes the campaign (its row and the tasks' rows are locked in different orders)
    while the others move tasks: no write may deadlock.
    """
    writers, per_writer = 4, 40
    setup = backend.handle()
    with_tasks(setup, count=writers * per_writer)
    setup.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0)
    setup.set_campaign_state("c1", {CampaignState.PROVISIONING}, CampaignState.ACTIVE, at=T0)
    start = setup.last_change_id()
    handles = [backend.handle() for _ in range(writers + 1)]
    reader = backend.handle()
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[int] = []

    def write(w: int) -> None:
        try:
            for i in range(per_writer):
                tid = task_id("c1", w * per_writer + i)
                handles[w].transition(tid, S.PENDING, S.RUNNING, at=T0)
                handles[w].transition(tid, S.RUNNING, S.FINISHED, at=T0)
        except BaseException as exc:
            errors.append(exc)

    def change_campaign() -> None:
        store = handles[writers]
        a, p = CampaignState.ACTIVE, CampaignState.PAUSED
        try:
            for i in range(per_writer):
                assert store.set_campaign_state("c1", {a}, p, at=T0, reason="pause")
                store.save_checkpoint("c1", {"i": i}, at=T0, note=f"step {i}")
                assert store.set_campaign_state("c1", {p}, a, at=T0, reason="resume")
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        after = start
        try:
            while True:
                finished = done.is_set()
                page = reader.changes_after(after, limit=50)
                seen.extend(e.id for e in page)
                if page:
                    after = page[-1].id
                elif finished:
                    return
        except BaseException as exc:
            errors.append(exc)

    tail = threading.Thread(target=read)
    tail.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    threads.append(threading.Thread(target=change_campaign))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    tail.join()

    assert errors == []
    total = writers * per_writer * 2 + per_writer * 3
    logged = [e.id for e in all_changes(setup, after=start)]
    assert len(logged) == total
    # Every entry once, in id order: no gap, no repeat (ids increase; they need not be dense).
    assert seen == logged
    assert setup.last_change_id() == logged[-1]
