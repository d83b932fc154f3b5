"""The BulkScheduler contract (``create_many``), run against every adapter that writes in bulk,
and against ``submit_many`` of those that write a batch in the background.

``create_many`` answers each item as ``create`` would have, in order: None where the schedule
now exists as asked (made by the call, or there already with the same token), or the Conflict
(another token), returned in its slot. Its items give the instant a schedule is due
(``DueArgs``), where ``create`` takes the wall time: the schedule made is the one ``create``
makes from that instant's wall time in the zone. The builders are the Scheduler contract's
(:mod:`tests.contract.test_scheduler`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast
from zoneinfo import ZoneInfo

import pytest

from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.ports import (
    BackgroundBulkScheduler,
    BulkScheduler,
    CreateArgs,
    DueArgs,
    Scheduler,
)
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock
from tests.contract.test_scheduler import BERLIN, BUILDERS, START, Harness, Recorder, local

#: The adapters whose scheduler is a BulkScheduler (test_port_abilities checks the list).
BULK = ("embedded", "procrastinate")


#: (adapter, how it writes a batch): ``submit_many`` where the adapter has one.
WAYS = [*((name, "create_many") for name in BULK), ("embedded", "submit_many")]


@pytest.fixture(params=WAYS, ids=["-".join(way) for way in WAYS])
def way(request: pytest.FixtureRequest) -> tuple[str, str]:
    return cast(tuple[str, str], request.param)


@pytest.fixture
def harness(way: tuple[str, str], tmp_path: Path) -> Iterator[Harness]:
    built = BUILDERS[way[0]](FakeClock(START), RecordingAlarm(), tmp_path)
    yield built
    built.scheduler.close()


class _Submitted:
    """``create_many`` as ``submit_many`` and its wait (a BackgroundBulkScheduler's)."""

    def __init__(self, scheduler: BackgroundBulkScheduler) -> None:
        self.scheduler = scheduler

    def create_many(self, items: Sequence[DueArgs]) -> Sequence[Exception | None]:
        return self.scheduler.submit_many(items)()


@pytest.fixture
def bulk(harness: Harness, way: tuple[str, str]) -> BulkScheduler:
    """The adapter's ``create_many``, or its ``submit_many`` and the wait."""
    assert issubclass(type(harness.scheduler), BulkScheduler)
    if way[1] == "create_many":
        return cast(BulkScheduler, harness.scheduler)
    assert issubclass(type(harness.scheduler), BackgroundBulkScheduler)
    return _Submitted(cast(BackgroundBulkScheduler, harness.scheduler))


def item(clock: FakeClock, name: str, token: str = "tok", seconds: float = 60.0) -> DueArgs:
    due = clock.now() + timedelta(seconds=seconds)
    return (name, "g1", due, BERLIN, {"task_id": name}, token, 2)


def as_create(args: DueArgs) -> CreateArgs:
    """``create``'s arguments for a bulk item: its instant as wall time in its zone."""
    name, group, due, zone, payload, token, retries = args
    wall = due.astimezone(ZoneInfo(zone))
    return (name, group, datetime.combine(wall.date(), wall.time()), zone, payload, token, retries)


def kinds(results: Sequence[object]) -> list[str]:
    return ["ok" if r is None else type(r).__name__ for r in results]


def names(scheduler: Scheduler) -> list[str]:
    return [s.name for s in scheduler.list("g1", limit=5000)]


def test_near_and_far_items_are_created_in_order_and_fire_when_due(
    harness: Harness, bulk: BulkScheduler
) -> None:
    clock = harness.clock
    # due in a minute (deferred at once on procrastinate) and in two days (parked there)
    items = [item(clock, f"s-{i:02}", f"t{i}", 60.0 if i % 2 else 2 * 86400.0) for i in range(20)]
    out = bulk.create_many(items)
    assert kinds(out) == ["ok"] * 20
    assert names(harness.scheduler) == [f"s-{i:02}" for i in range(20)]
    for i, seconds in ((0, 2 * 86400.0), (1, 60.0)):
        got = harness.scheduler.get(f"s-{i:02}")
        made = harness.scheduler.create(*as_create(items[i]))  # the same token: the one stored
        assert got is not None and got.client_token == f"t{i}"
        assert got == made and got.due_at == START + timedelta(seconds=seconds)
        assert (got.group, got.timezone, got.max_retries, got.attempts) == ("g1", BERLIN, 2, 0)
        assert got.at_local == local(clock, seconds) == as_create(items[i])[2]
        assert dict(got.payload) == {"task_id": f"s-{i:02}"}
        assert got.created_at == START
    assert harness.fire_due is not None
    recorder = Recorder()
    clock.advance(seconds=61)
    assert harness.fire_due(recorder) == 10
    assert sorted(recorder.names) == [f"s-{i:02}" for i in range(1, 20, 2)]
    assert names(harness.scheduler) == [f"s-{i:02}" for i in range(0, 20, 2)]


def test_an_existing_name_with_the_same_token_is_returned_not_duplicated(
    harness: Harness, bulk: BulkScheduler
) -> None:
    clock = harness.clock
    first = harness.scheduler.create(*as_create(item(clock, "old", "a")))
    out = bulk.create_many([item(clock, "new-1"), item(clock, "old", "a"), item(clock, "new-2")])
    assert kinds(out) == ["ok", "ok", "ok"]
    assert harness.scheduler.get("old") == first
    assert names(harness.scheduler) == ["new-1", "new-2", "old"]
    recorder = Recorder()
    clock.advance(seconds=61)
    assert harness.fire_due is not None and harness.fire_due(recorder) == 3
    assert sorted(recorder.names) == ["new-1", "new-2", "old"]


def test_another_token_is_a_conflict_in_its_slot_and_the_rest_is_created(
    harness: Harness, bulk: BulkScheduler
) -> None:
    clock = harness.clock
    harness.scheduler.create(*as_create(item(clock, "old", "a", seconds=2 * 86400.0)))
    out = bulk.create_many([item(clock, "new-1"), item(clock, "old", "b"), item(clock, "new-2")])
    assert kinds(out) == ["ok", "Conflict", "ok"]
    assert "old" in str(out[1])
    assert names(harness.scheduler) == ["new-1", "new-2", "old"]
    kept = harness.scheduler.get("old")
    assert kept is not None and kept.client_token == "a"  # the conflict changed nothing


def test_a_name_twice_in_one_batch_behaves_as_two_creates(
    harness: Harness, bulk: BulkScheduler
) -> None:
    clock = harness.clock
    out = bulk.create_many(
        [
            item(clock, "twice", "a"),
            item(clock, "far", "f", seconds=2 * 86400.0),
            item(clock, "twice", "a"),  # the same token: the schedule just made
            item(clock, "twice", "b"),  # another token: Conflict
            item(clock, "far", "f", seconds=2 * 86400.0),
        ]
    )
    assert kinds(out) == ["ok", "ok", "ok", "Conflict", "ok"]
    twice = harness.scheduler.get("twice")
    assert twice is not None and twice.client_token == "a"
    assert names(harness.scheduler) == ["far", "twice"]
    recorder = Recorder()
    clock.advance(seconds=61)
    assert harness.fire_due is not None and harness.fire_due(recorder) == 1
    assert recorder.names == ["twice"]


def test_an_invalid_item_raises_naming_the_field_and_writes_nothing(
    harness: Harness, bulk: BulkScheduler
) -> None:
    clock = harness.clock
    bad = ("n-1", "g1", clock.now(), BERLIN, {"task_id": "n-1"}, "bad token!", 2)
    with pytest.raises(InvalidField, match="client_token"):
        bulk.create_many([item(clock, "n-0"), bad])
    assert names(harness.scheduler) == []
    assert bulk.create_many([]) == []


@pytest.mark.parametrize(
    "due", [datetime(2026, 12, 7, 9, 0), "2026-12-07T09:00:00+00:00"], ids=["naive", "text"]
)
def test_an_instant_that_is_not_an_aware_datetime_is_refused_as_due_at(
    harness: Harness, bulk: BulkScheduler, due: object
) -> None:
    clock = harness.clock
    bad = ("n-1", "g1", due, BERLIN, {"task_id": "n-1"}, "tok", 2)
    with pytest.raises(InvalidField, match="due_at"):
        bulk.create_many([item(clock, "n-0"), bad])  # type: ignore[list-item]
    assert names(harness.scheduler) == []


def test_an_instant_in_the_repeated_hour_is_due_then_in_any_zone_it_is_given_in(
    harness: Harness, bulk: BulkScheduler
) -> None:
    """Europe/Berlin shows 02:30 twice on 2027-10-31: each pass's instant is due when given,
    and keeps its wall time's fold; an instant given in another zone is the same instant."""
    first = datetime(2027, 10, 31, 0, 30, tzinfo=UTC)  # 02:30 CEST
    second = first + timedelta(hours=1)  # 02:30 CET
    elsewhere = second.astimezone(ZoneInfo("America/New_York"))
    out = bulk.create_many(
        [
            ("first", "g1", first, BERLIN, {}, "t1", 2),
            ("second", "g1", second, BERLIN, {}, "t2", 2),
            ("elsewhere", "g1", elsewhere, BERLIN, {}, "t3", 2),
        ]
    )
    assert kinds(out) == ["ok"] * 3
    got = {name: harness.scheduler.get(name) for name in ("first", "second", "elsewhere")}
    assert [(s.due_at, s.at_local.hour, s.at_local.minute) for s in got.values() if s] == [
        (first, 2, 30),
        (second, 2, 30),
        (second, 2, 30),
    ]


@pytest.mark.parametrize(
    ("field", "position", "value"),
    [("group", 1, "bad group"), ("max_retries", 6, 186), ("max_retries", 6, True)],
)
def test_a_shared_field_is_checked_in_every_item_not_only_the_first(
    harness: Harness, bulk: BulkScheduler, field: str, position: int, value: object
) -> None:
    """A batch checks each distinct group and max_retries once: an item whose value differs
    from the earlier ones' is still checked, and refuses the batch naming the field."""
    clock = harness.clock
    good = [item(clock, f"n-{i}") for i in range(3)]
    bad = list(item(clock, "n-3"))
    bad[position] = value
    with pytest.raises(InvalidField, match=field):
        bulk.create_many([*good, tuple(bad)])  # type: ignore[list-item]
    assert names(harness.scheduler) == []


def test_concurrent_batches_with_overlapping_names_keep_one_schedule_per_name(
    harness: Harness, bulk: BulkScheduler
) -> None:
    clock = harness.clock
    # Batch k holds names k*50 .. k*50+99 with token t<k>, so each name but the first and last
    # fifty is in two batches racing each other, one of which has it due in a minute and the
    # other in two days (deferred and parked on procrastinate): one of them must see the other.
    results: dict[int, Sequence[Exception | None]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def near(i: int, k: int) -> bool:
        return (i + k) % 2 == 1

    def batch(k: int) -> Callable[[], None]:
        def run() -> None:
            items = [
                item(clock, f"n-{i:03}", f"t{k}", 60.0 if near(i, k) else 2 * 86400.0)
                for i in range(k * 50, k * 50 + 100)
            ]
            barrier.wait()
            try:
                for _ in range(3):  # again: idempotent for its own token
                    results[k] = bulk.create_many(items)
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=batch(k)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert names(harness.scheduler) == [f"n-{i:03}" for i in range(200)]
    due_soon: set[str] = set()
    for k, out in results.items():
        for offset, result in enumerate(out):
            i = k * 50 + offset
            stored = harness.scheduler.get(f"n-{i:03}")
            assert stored is not None
            if isinstance(result, Conflict):
                assert stored.client_token != f"t{k}"
            else:
                assert result is None
                assert stored.client_token == f"t{k}"
                if near(i, k):
                    due_soon.add(f"n-{i:03}")
    recorder = Recorder()
    clock.advance(seconds=61)
    assert harness.fire_due is not None
    assert harness.fire_due(recorder) == len(due_soon)
    assert sorted(recorder.names) == sorted(due_soon)
