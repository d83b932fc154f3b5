"""SqliteTaskStore on SQLite: the send path's statements run on a driver connection per thread.

Those connections behave as the engine's pool does where it shows: several threads claim and
finish tasks at once without losing a change-log row, a dead thread's connection is closed
when another thread opens one, and ``close()`` closes them all while a later call opens anew
(as after the engine's ``dispose()``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from sendqueue.adapters.sql import SqliteTaskStore
from sendqueue.domain.lifecycle import TaskState
from tests.support.app import claim_and_finish_from_threads, csv_bytes, fake_app, open_policy


def _store_with_tasks(tmp_path: Path, count: int) -> tuple[SqliteTaskStore, str, list[str]]:
    store = SqliteTaskStore(f"sqlite:///{tmp_path / 'store.db'}")
    app = fake_app(store=store)
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(count), policy=open_policy()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return store, cid, [t.id for t in store.list_tasks(cid, limit=count)]


def test_threads_claim_and_finish_on_their_own_connections(tmp_path: Path) -> None:
    store, cid, ids = _store_with_tasks(tmp_path, 200)
    claim_and_finish_from_threads(store, cid, ids)
    store.close()


def test_dead_threads_connections_are_closed_and_close_reopens(tmp_path: Path) -> None:
    store, _cid, ids = _store_with_tasks(tmp_path, 3)
    threads = []
    for _ in range(6):
        thread = threading.Thread(target=store.get_task, args=(ids[0],))
        thread.start()
        thread.join()
        threads.append(thread)
    # each new thread's connection closes the ones dead threads left: only the last one's is
    # kept (and the main thread's, when provisioning read through the driver's path)
    owners = [t for t, _ in store._own]
    assert threads[-1] in owners
    assert not set(threads[:-1]) & set(owners)
    assert set(owners) <= {threads[-1], threading.current_thread()}
    store.close()
    assert store._own == []
    task = store.get_task(ids[2])  # opens anew, like the engine after dispose()
    assert task is not None and task.state is TaskState.PENDING
    store.close()
