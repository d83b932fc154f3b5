"""PostgresTaskStore: the send path's and the provisioner's statements run on a psycopg
connection per thread, in autocommit mode, with no pre-ping.

What the pool's pre-ping gave must still hold: a connection the server ended while it sat idle
is replaced on its next use (a read, and a write that certainly did not run, are retried once
on a new connection), and a database that refuses connections raises StoreUnavailable at once,
then works again when it is back. Several threads claim and finish tasks at once without losing
a change-log row, and ``close()`` closes the connections while a later call opens anew.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from sendqueue.adapters.sql import PostgresTaskStore
from sendqueue.domain.errors import NotFound, StoreUnavailable
from sendqueue.domain.lifecycle import TaskState
from tests.conftest import POSTGRES_ADMIN_URL
from tests.support.app import T0, claim_and_finish_from_threads, csv_bytes, fake_app, open_policy

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresTaskStore]:
    opened = PostgresTaskStore(postgres_url)
    yield opened
    opened.close()


def _provisioned(store: PostgresTaskStore, count: int) -> tuple[str, list[str]]:
    app = fake_app(store=store)
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(count), policy=open_policy()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid, [t.id for t in store.list_tasks(cid, limit=count)]


def _admin(sql: str, *params: object) -> None:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql, params)


def _terminate(database: str) -> None:
    _admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        database,
    )


def _backend_pid(store: PostgresTaskStore) -> int:
    """The server process of the fast-path connection the next call would use."""
    generation, db = store._connections.checkout()
    try:
        pid: int = db.info.backend_pid
    finally:
        store._connections.checkin(generation, db)
    return pid


def test_threads_claim_and_finish_on_their_own_connections(store: PostgresTaskStore) -> None:
    cid, ids = _provisioned(store, 200)
    claim_and_finish_from_threads(store, cid, ids)


def test_a_connection_the_server_ended_is_replaced_on_its_next_use(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    database = postgres_url.rsplit("/", 1)[1]
    cid, ids = _provisioned(store, 3)
    first = _backend_pid(store)
    _terminate(database)
    task = store.get_task(ids[0])  # a read: retried once on a new connection
    assert task is not None and task.state is TaskState.PENDING
    second = _backend_pid(store)
    assert second != first
    _terminate(database)
    # a write the server refused because the session had ended: it never ran, so it is retried
    claimed = store.transition(ids[0], TaskState.PENDING, TaskState.RUNNING, at=T0)
    assert claimed is not None and claimed.state is TaskState.RUNNING
    assert _backend_pid(store) != second
    assert store.has_unfinished_tasks(cid)
    entries = store.changes_after(0, campaign_id=cid, limit=100)
    moved = [(e.task_id, e.to_state) for e in entries if e.from_state == TaskState.PENDING.value]
    assert moved == [(ids[0], TaskState.RUNNING.value)]  # logged exactly once


def test_a_database_that_refuses_connections_raises_at_once_then_recovers(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    database = postgres_url.rsplit("/", 1)[1]
    cid, ids = _provisioned(store, 2)
    _admin(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    try:
        _terminate(database)
        for call in (
            lambda: store.get_task(ids[0]),
            lambda: store.campaign_state(cid),
            lambda: store.has_unfinished_tasks(cid),
            lambda: store.transition(ids[0], TaskState.PENDING, TaskState.RUNNING, at=T0),
            lambda: store.list_recipients(cid),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - started < 5
    finally:
        _admin(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    claimed = store.transition(ids[0], TaskState.PENDING, TaskState.RUNNING, at=T0)
    assert claimed is not None
    assert store.get_task(ids[1]) is not None


def test_statement_errors_are_not_retried_and_keep_the_connection(store: PostgresTaskStore) -> None:
    _cid, ids = _provisioned(store, 1)
    pid = _backend_pid(store)
    with pytest.raises(NotFound):
        store.list_recipients("no-such-campaign")
    with pytest.raises(NotFound):
        store.campaign_state("no-such-campaign")
    assert _backend_pid(store) == pid
    assert store.get_task(ids[0]) is not None


def test_threads_share_a_bounded_set_of_idle_connections(store: PostgresTaskStore) -> None:
    """A web server's many threads must not each keep a connection open: the server allows
    a hundred in all, for every process."""
    _cid, ids = _provisioned(store, 2)
    pid = _backend_pid(store)
    for _ in range(3):
        thread = threading.Thread(target=store.get_task, args=(ids[0],))
        thread.start()
        thread.join()
    # reused, not one per thread
    assert len(store._connections.idle()) == 1 and _backend_pid(store) == pid
    held = [store._connections.checkout() for _ in range(10)]  # ten calls at once
    assert len({db.info.backend_pid for _, db in held}) == 10
    for generation, db in held:
        store._connections.checkin(generation, db)
    kept = list(store._connections.idle())
    assert len(kept) == 4  # pg_idle_connections
    assert sum(db.closed for _, db in held) == 6
    store.close()
    assert store._connections.idle() == [] and all(db.closed for db in kept)
    task = store.get_task(ids[1])  # opens anew, like the engine after dispose()
    assert task is not None and task.state is TaskState.PENDING
