"""The ChangeLog contract (sendqueue.ports.ChangeLog), run against every backend of
:mod:`tests.contract.store_backends`.
"""

from __future__ import annotations

import threading

from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import task_id
from sendqueue.ports import TaskStore
from tests.contract.store_backends import (
    T0,
    Backend,
    S,
    all_changes,
    backend,
    drive,
    store,
    with_tasks,
)

__all__ = ["backend", "store"]  # the fixtures: every backend's store


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
