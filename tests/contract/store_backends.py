"""The backends every store contract runs against (tests/contract/test_*.py), with their
fixtures and builders.

Each test receives ``store`` (and, where it needs more handles on the same data, ``backend``).
To run the contracts against a new adapter, add one entry to ``BACKENDS``: a function that
returns a :class:`Backend` whose ``open`` makes a new handle on one shared database (a new
engine, a new client), and whose ``open_unreachable`` makes a handle on a backend that cannot
be reached. A handle is a :class:`~sendqueue.ports.StoreBackend`: every aggregate's port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sendqueue.adapters.sql import open_store
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, Recipient, Task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.ports import StoreBackend, TaskStore
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.aws import dynamodb_backend

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
S = TaskState


# --- backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    """How to reach one adapter's storage from a test."""

    name: str
    open: Callable[[], StoreBackend]
    open_unreachable: Callable[[], StoreBackend]
    #: Tasks in the bulk-insert test. A backend may lower it only where the size costs it
    #: something the real service does not (and says why); the test checks the same property.
    bulk_tasks: int = 20_000
    opened: list[StoreBackend] = field(default_factory=list)

    def handle(self) -> StoreBackend:
        """A new handle on the shared data, closed at the end of the test."""
        store = self.open()
        self.opened.append(store)
        return store

    def unreachable(self) -> StoreBackend:
        store = self.open_unreachable()
        self.opened.append(store)
        return store


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    shared = InMemoryTaskStore()

    def unreachable() -> StoreBackend:
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
def store(backend: Backend) -> StoreBackend:
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
