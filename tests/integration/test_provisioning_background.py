"""Provisioning on the embedded layer, whose schedules of a chunk are written on the layer's own
thread while the next chunk is made (``submit_many``). A chunk's checkpoint is saved once its
schedules are written, before the next chunk's tasks go in, so it always has ``scheduled ==
after`` and a resumed run finds at most one chunk stored past it; however the tasks phase ends
(done, out of time, an error), nothing is left writing, and a rerun finishes with exactly one
task and one schedule per email."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.domain.errors import Conflict
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.services.scheduling.provisioning import ProvisionProgress
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy
from tests.support.faults import CrashAfter, StoreCrash
from tests.unit.test_provisioning import _assert_exactly_one_each, _create, _schedules


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def layer(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedScheduler]:
    scheduler = EmbeddedScheduler(f"sqlite:///{tmp_path / 'schedules.db'}", clock=clock)
    yield scheduler
    scheduler.close()


def _progress_notes(store: InMemoryTaskStore, cid: str) -> list[str]:
    entries = store.changes_after(0, campaign_id=cid, limit=10_000)
    return [e.note or "" for e in entries if e.to_state == "progress"]


def test_each_chunk_is_checkpointed_once_its_schedules_are_written(
    clock: FakeClock, layer: EmbeddedScheduler
) -> None:
    store = InMemoryTaskStore()
    app = fake_app(provision_chunk=500, clock=clock, store=store, scheduler=layer)
    cid = _create(app, 1200)
    seen: list[tuple[str, int]] = []
    report = app.provisioner.provision(cid, progress=lambda p: seen.append((p.phase, p.done)))
    assert (report.status, report.tasks_created, report.schedules_created) == ("done", 1200, 1200)
    _assert_exactly_one_each(app, cid, 1200)
    # a chunk's schedules are done (and reported) before the next chunk's tasks go in
    assert seen == [
        ("tasks", 500), ("schedules", 500), ("tasks", 1000), ("schedules", 1000),
        ("tasks", 1200), ("schedules", 1200),
    ]  # fmt: skip
    notes = _progress_notes(store, cid)
    assert [n for n in notes if n.startswith("tasks")] == [
        "tasks 500/1200, schedules 500/1200",
        "tasks 1000/1200, schedules 1000/1200",
        "tasks 1200/1200, schedules 1200/1200",
    ]
    assert store.get_campaign(cid).state is CampaignState.ACTIVE


@pytest.mark.parametrize(
    ("method", "n"),
    [
        ("insert_tasks", 2),  # the first chunk's schedules in flight
        ("insert_tasks", 3),  # the second's
        ("list_recipients", 3),  # after the second chunk, before the third's tasks
        ("save_checkpoint", 3),  # the first chunk's own checkpoint
    ],
)
def test_an_error_lands_the_chunk_in_flight_and_a_rerun_finishes(
    clock: FakeClock, layer: EmbeddedScheduler, method: str, n: int
) -> None:
    store = InMemoryTaskStore()
    crashing = fake_app(
        provision_chunk=500, clock=clock, store=CrashAfter(store, method, n), scheduler=layer
    )
    cid = _create(crashing, 1500)
    with pytest.raises(StoreCrash):
        crashing.provisioner.provision(cid)
    checkpoint = dict(store.get_campaign(cid).checkpoint or {})
    if method != "save_checkpoint":
        # the chunk in flight was written and checkpointed before the error went on
        assert checkpoint["after"] == checkpoint["scheduled"] == 500 * (n - 1) - 1
        assert len(_schedules(crashing, cid)) == 500 * (n - 1)
    clock.advance(seconds=61)  # the crashed run's provisioning lease expires
    fresh = fake_app(provision_chunk=500, clock=clock, store=store, scheduler=layer)
    assert fresh.provisioner.provision(cid).status == "done"
    _assert_exactly_one_each(fresh, cid, 1500)


def test_out_of_time_lands_the_chunk_in_flight_and_the_continuation_goes_on_inline(
    clock: FakeClock, layer: EmbeddedScheduler
) -> None:
    store = InMemoryTaskStore()
    app = fake_app(provision_chunk=500, clock=clock, store=store, scheduler=layer)
    cid = _create(app, 1500)
    left = iter([100.0, 100.0, 0.0])  # asked before each chunk: the third finds none left
    handed: list[dict[str, object]] = []
    first = app.provisioner.provision(
        cid,
        time_left=lambda: next(left),
        safety_margin=1.0,
        continuation=lambda _, checkpoint: handed.append(checkpoint),
    )
    assert (first.status, first.tasks_created, first.schedules_created) == ("continued", 1000, 1000)
    [checkpoint] = handed
    assert (checkpoint["phase"], checkpoint["after"], checkpoint["scheduled"]) == (
        "tasks", 999, 999
    )  # fmt: skip
    seen: list[ProvisionProgress] = []
    rest = app.provisioner.provision(cid, progress=seen.append)
    assert (rest.status, rest.tasks_created, rest.schedules_created) == ("done", 500, 500)
    # written chunk by chunk with its tasks, not left to the schedules phase
    assert [(p.phase, p.done) for p in seen] == [("tasks", 1500), ("schedules", 1500)]
    _assert_exactly_one_each(app, cid, 1500)


def test_a_layer_that_cannot_write_stops_the_run_and_a_rerun_finishes(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "schedules.db"
    layer = EmbeddedScheduler(f"sqlite:///{path}", clock=clock, busy_timeout=0.05)
    store = InMemoryTaskStore()
    app = fake_app(provision_chunk=50, clock=clock, store=store, scheduler=layer)
    cid = _create(app, 120)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the layer's file stays locked
    try:
        stopped = app.provisioner.provision(cid)
    finally:
        other.execute("ROLLBACK")
    assert (stopped.status, stopped.tasks_created, stopped.schedules_created) == ("stopped", 120, 0)
    checkpoint = store.get_campaign(cid).checkpoint or {}
    assert (checkpoint["phase"], checkpoint["after"], "scheduled" in checkpoint) == (
        "schedules", -1, False
    )  # fmt: skip
    done = app.provisioner.provision(cid)
    assert (done.status, done.schedules_created) == ("done", 120)
    _assert_exactly_one_each(app, cid, 120)
    layer.close()


class _Watching(InMemoryTaskStore):
    """Records, at each insert of tasks, the positions stored past the saved checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead: list[int] = []

    def insert_tasks(self, tasks: Any, *, at: datetime, bookings: Any = ()) -> int:
        campaign = self.get_campaign(tasks[0].campaign_id)
        after = int(str((campaign.checkpoint or {}).get("after", -1)))
        stored = self.list_tasks(campaign.id, after=after, limit=100_000)
        self.ahead.append(len(stored))
        return super().insert_tasks(tasks, at=at, bookings=bookings)


@pytest.mark.parametrize("senders", [0, 2])
def test_no_chunk_goes_in_while_the_one_before_is_past_its_checkpoint(
    clock: FakeClock, layer: EmbeddedScheduler, senders: int
) -> None:
    """A process killed at any instant (no finally) leaves at most one chunk stored past the
    checkpoint, the one a resumed run's first chunk finds (with its plan and bookings)."""
    store = _Watching()
    app = fake_app(provision_chunk=300, clock=clock, store=store, scheduler=layer)
    ids = [app.senders.add(email=f"s{n}@example.com", daily_cap=5000).id for n in range(senders)]
    cid = app.campaign_import.create(
        name="p", recipients=csv_bytes(1000), policy=open_policy(), senders=ids
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    assert store.ahead == [0, 0, 0, 0]
    _assert_exactly_one_each(app, cid, 1000)


class _FailLastCheckpoint(InMemoryTaskStore):
    """Its checkpoint of the last chunk fails."""

    def save_checkpoint(self, campaign_id: str, checkpoint: Any, **kw: Any) -> None:
        if str(kw.get("note") or "").startswith("tasks 120/120"):
            raise StoreCrash("checkpoint write failed")
        super().save_checkpoint(campaign_id, checkpoint, **kw)


def test_the_last_chunks_failed_checkpoint_fails_the_run_even_called_in_an_except_block(
    clock: FakeClock, layer: EmbeddedScheduler
) -> None:
    app = fake_app(provision_chunk=50, clock=clock, store=_FailLastCheckpoint(), scheduler=layer)
    cid = _create(app, 120)
    try:
        raise KeyError("an error the caller is handling")
    except KeyError:
        with pytest.raises(StoreCrash):
            app.provisioner.provision(cid)


class _TakenOver(InMemoryTaskStore):
    """After the second chunk's tasks this process stalls past its lease, and another one
    takes the lease and moves the checkpoint on before the next renewal."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock, self.inserts = clock, 0
        self.theirs: dict[str, object] | None = None

    def insert_tasks(self, tasks: Any, *, at: datetime, bookings: Any = ()) -> int:
        out = super().insert_tasks(tasks, at=at, bookings=bookings)
        self.inserts += 1
        if self.inserts == 2:
            self.clock.advance(seconds=61)
            cid = tasks[0].campaign_id
            assert self.acquire_lease(
                f"provision:{cid}", "other", ttl_seconds=600, at=self.clock.now()
            )
            self.theirs = {**(self.get_campaign(cid).checkpoint or {}), "after": 1499}
            self.save_checkpoint(cid, self.theirs, at=self.clock.now(), note="other")
        return out


def test_a_run_that_lost_its_lease_waits_for_its_writes_and_saves_no_checkpoint(
    clock: FakeClock, layer: EmbeddedScheduler
) -> None:
    store = _TakenOver(clock)
    app = fake_app(provision_chunk=500, clock=clock, store=store, scheduler=layer)
    cid = _create(app, 1500)
    with pytest.raises(Conflict, match="lost the provisioning lease"):
        app.provisioner.provision(cid)
    assert store.get_campaign(cid).checkpoint == store.theirs
    assert len(_schedules(app, cid)) == 1000  # the second chunk's writes ended, unrecorded
