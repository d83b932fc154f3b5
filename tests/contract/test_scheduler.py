"""The Scheduler contract (sendqueue.ports.Scheduler), run against every adapter.

To add an adapter, add a builder to ``BUILDERS``: it receives the fake clock, a recording alarm
and a temporary directory and returns a :class:`Harness`. Adapters that can fire synchronously
on the fake clock (``fire_due``) run the firing tests too; the others (EventBridge, where Lambda
fires) set ``fire_due`` to None and those tests skip with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.domain.errors import Conflict, InvalidField, NotFound
from sendqueue.ports import Scheduler, Target
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.aws import eventbridge_harness
from tests.support.procrastinate import contract_harness

START = datetime(2026, 3, 20, 8, 0, tzinfo=UTC)
BERLIN = "Europe/Berlin"


@dataclass
class Harness:
    scheduler: Scheduler
    clock: FakeClock
    alarm: RecordingAlarm
    fire_due: Callable[[Target], int] | None


def _fake(clock: FakeClock, alarm: RecordingAlarm, tmp: Path) -> Harness:
    scheduler = FakeScheduler(clock, alarm=alarm, retry_backoff=5.0, max_backoff=300.0)
    return Harness(scheduler, clock, alarm, scheduler.fire_due)


def _embedded(clock: FakeClock, alarm: RecordingAlarm, tmp: Path) -> Harness:
    scheduler = EmbeddedScheduler(
        f"sqlite:///{tmp / 'scheduler.db'}",
        clock=clock,
        alarm=alarm,
        retry_backoff=5.0,
        max_backoff=300.0,
    )
    return Harness(scheduler, clock, alarm, scheduler.fire_due)


BUILDERS: dict[str, Callable[[FakeClock, RecordingAlarm, Path], Harness]] = {
    "fake": _fake,
    "embedded": _embedded,
    "procrastinate": contract_harness,
    "eventbridge": eventbridge_harness,
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def alarm() -> RecordingAlarm:
    return RecordingAlarm()


@pytest.fixture(params=sorted(BUILDERS))
def harness(
    request: pytest.FixtureRequest, clock: FakeClock, alarm: RecordingAlarm, tmp_path: Path
) -> Iterator[Harness]:
    built = BUILDERS[request.param](clock, alarm, tmp_path)
    yield built
    built.scheduler.close()


@pytest.fixture
def scheduler(harness: Harness) -> Scheduler:
    return harness.scheduler


@pytest.fixture
def fire(harness: Harness) -> Callable[[Target], int]:
    if harness.fire_due is None:
        pytest.skip("this adapter cannot fire synchronously on a fake clock")
    return harness.fire_due


def local(clock: FakeClock, seconds: float = 0.0, zone: str = BERLIN) -> datetime:
    """The naive wall-clock time in ``zone`` that is ``seconds`` after the clock's now."""
    at = clock.now() + timedelta(seconds=seconds)
    return at.astimezone(ZoneInfo(zone)).replace(tzinfo=None)


def make(
    scheduler: Scheduler,
    clock: FakeClock,
    name: str,
    *,
    seconds: float = 60.0,
    group: str = "g1",
    token: str = "tok",
    max_retries: int = 2,
) -> None:
    scheduler.create(
        name, group, local(clock, seconds), BERLIN, {"task_id": name}, token, max_retries
    )


class Recorder:
    """A target that records payloads and fails as told."""

    def __init__(self, fail: Callable[[Mapping[str, str]], bool] = lambda _: False) -> None:
        self.calls: list[dict[str, str]] = []
        self.fail = fail

    def __call__(self, payload: Mapping[str, str]) -> None:
        self.calls.append(dict(payload))
        if self.fail(payload):
            raise RuntimeError(f"boom {payload['task_id']}")

    @property
    def names(self) -> list[str]:
        return [c["task_id"] for c in self.calls]


def dead_letter_names(scheduler: Scheduler) -> list[str]:
    return [letter.schedule_name for letter in scheduler.dead_letters()]


# --------------------------------------------------------------------------- validation
VALID = {
    "name": "sq-c1-0",
    "group": "c1",
    "at_local": datetime(2026, 3, 20, 10, 0),
    "timezone": BERLIN,
    "payload": {"task_id": "c1-0"},
    "client_token": "tok",
    "max_retries": 2,
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", ""),
        ("name", "x" * 65),
        ("name", "has space"),
        ("name", "slash/no"),
        ("name", "umlaut-ä"),
        ("group", ""),
        ("group", "g" * 65),
        ("group", "a:b"),
        ("client_token", ""),
        ("client_token", "t" * 65),
        ("client_token", "dot.not-allowed"),
        ("max_retries", -1),
        ("max_retries", 186),
        ("max_retries", True),
        ("at_local", datetime(2026, 3, 20, 10, 0, tzinfo=UTC)),
        ("timezone", "Mars/Olympus"),
        ("timezone", ""),
        ("payload", {"task_id": 7}),
    ],
)
def test_invalid_arguments_name_the_field(scheduler: Scheduler, field: str, value: object) -> None:
    args = {**VALID, field: value}
    with pytest.raises(InvalidField) as info:
        scheduler.create(**args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert scheduler.get("sq-c1-0") is None


def test_the_limits_themselves_are_accepted(scheduler: Scheduler) -> None:
    name = "N" * 30 + "0123456789-_." + "z" * 21
    token = "T" * 40 + "0123456789-_" + "q" * 12
    assert len(name) == 64
    assert len(token) == 64
    created = scheduler.create(
        name, "g.r-o_up", datetime(2026, 3, 20, 10), BERLIN, {}, token, max_retries=185
    )
    assert created.max_retries == 185
    assert scheduler.get(name) == created
    scheduler.create("zero", "g", datetime(2026, 3, 20, 10), "UTC", {}, "t", max_retries=0)
    assert scheduler.get("zero") is not None


@pytest.mark.parametrize("bad", ["", "a b", "x" * 65])
def test_get_delete_and_list_validate_too(scheduler: Scheduler, bad: str) -> None:
    with pytest.raises(InvalidField) as info:
        scheduler.get(bad)
    assert info.value.field == "name"
    with pytest.raises(InvalidField) as info:
        scheduler.delete(bad)
    assert info.value.field == "name"
    with pytest.raises(InvalidField) as info:
        scheduler.list(bad)
    assert info.value.field == "group"


# --------------------------------------------------------------------------- create/get/delete
def test_create_returns_and_stores_the_schedule(scheduler: Scheduler, clock: FakeClock) -> None:
    created = scheduler.create(
        "sq-a", "camp", datetime(2026, 3, 20, 10, 30), BERLIN, {"task_id": "a"}, "tok-1", 3
    )
    assert created.name == "sq-a"
    assert created.group == "camp"
    assert created.at_local == datetime(2026, 3, 20, 10, 30)
    assert created.timezone == BERLIN
    assert dict(created.payload) == {"task_id": "a"}
    assert created.client_token == "tok-1"
    assert created.due_at == datetime(2026, 3, 20, 9, 30, tzinfo=UTC)
    assert created.max_retries == 3
    assert created.attempts == 0
    assert created.created_at == clock.now()
    assert scheduler.get("sq-a") == created


def test_create_is_idempotent_for_the_same_token(scheduler: Scheduler, clock: FakeClock) -> None:
    first = scheduler.create("sq-a", "g", datetime(2026, 3, 20, 10), BERLIN, {"k": "1"}, "tok")
    clock.advance(30)
    # Same name and token: the existing schedule, unchanged, even if the arguments differ.
    again = scheduler.create("sq-a", "g", datetime(2026, 3, 21, 10), BERLIN, {"k": "2"}, "tok")
    assert again == first
    assert scheduler.list("g") == [first]


def test_create_with_another_token_conflicts(scheduler: Scheduler) -> None:
    first = scheduler.create("sq-a", "g", datetime(2026, 3, 20, 10), BERLIN, {}, "tok-1")
    with pytest.raises(Conflict):
        scheduler.create("sq-a", "g", datetime(2026, 3, 20, 10), BERLIN, {}, "tok-2")
    assert scheduler.get("sq-a") == first


def test_delete_is_idempotent(scheduler: Scheduler, clock: FakeClock) -> None:
    scheduler.delete("never-existed")
    make(scheduler, clock, "sq-a")
    make(scheduler, clock, "sq-b")
    scheduler.delete("sq-a")
    scheduler.delete("sq-a")
    assert scheduler.get("sq-a") is None
    assert scheduler.get("sq-b") is not None


def test_a_deleted_name_can_be_created_again_with_a_new_token(
    scheduler: Scheduler, clock: FakeClock
) -> None:
    make(scheduler, clock, "sq-a", token="one")
    scheduler.delete("sq-a")
    make(scheduler, clock, "sq-a", token="two")
    again = scheduler.get("sq-a")
    assert again is not None
    assert again.client_token == "two"


def test_get_of_a_missing_name_is_none(scheduler: Scheduler) -> None:
    assert scheduler.get("nothing-here") is None


def test_list_pages_by_name_within_a_group(scheduler: Scheduler, clock: FakeClock) -> None:
    g1 = [f"sq-{i:02d}" for i in (7, 3, 11, 0, 5, 9, 1)]
    g2 = ["sq-04", "sq-06", "sq-08"]
    for name in g1:
        make(scheduler, clock, name, group="g1")
    for name in g2:
        make(scheduler, clock, name, group="g2")
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        page = [s.name for s in scheduler.list("g1", after=after, limit=3)]
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert pages == [sorted(g1)[0:3], sorted(g1)[3:6], sorted(g1)[6:]]
    assert [s.name for s in scheduler.list("g2")] == g2
    assert all(s.group == "g2" for s in scheduler.list("g2"))
    assert scheduler.list("empty") == []


# --------------------------------------------------------------------------- time zones
@pytest.mark.parametrize(
    ("at_local", "zone", "expected_utc"),
    [
        # The day before and after Europe/Berlin springs forward (2026-03-29): +01:00 / +02:00.
        (datetime(2026, 3, 28, 9, 0), BERLIN, datetime(2026, 3, 28, 8, 0)),
        (datetime(2026, 3, 30, 9, 0), BERLIN, datetime(2026, 3, 30, 7, 0)),
        # 02:30 does not exist that night: the end of the gap, 03:00 CEST.
        (datetime(2026, 3, 29, 2, 30), BERLIN, datetime(2026, 3, 29, 1, 0)),
        (datetime(2026, 3, 29, 3, 0), BERLIN, datetime(2026, 3, 29, 1, 0)),
        # 02:30 happens twice on 2026-10-25: the first time (still CEST).
        (datetime(2026, 10, 25, 2, 30), BERLIN, datetime(2026, 10, 25, 0, 30)),
        (datetime(2026, 10, 25, 3, 30), BERLIN, datetime(2026, 10, 25, 2, 30)),
        # New York springs forward on 2026-03-08 at 02:00 to 03:00 EDT.
        (datetime(2026, 3, 8, 2, 15), "America/New_York", datetime(2026, 3, 8, 7, 0)),
        (datetime(2026, 7, 1, 12, 0), "UTC", datetime(2026, 7, 1, 12, 0)),
    ],
)
def test_due_at_is_the_wall_time_in_the_zone(
    scheduler: Scheduler, at_local: datetime, zone: str, expected_utc: datetime
) -> None:
    created = scheduler.create("sq-dst", "g", at_local, zone, {}, "tok")
    assert created.due_at == expected_utc.replace(tzinfo=UTC)
    assert created.at_local == at_local
    stored = scheduler.get("sq-dst")
    assert stored is not None
    assert stored.due_at == created.due_at
    assert stored.due_at.utcoffset() == timedelta(0)


def test_a_schedule_across_the_dst_change_fires_at_its_utc_instant(
    scheduler: Scheduler, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    clock.set(datetime(2026, 3, 28, 23, 0, tzinfo=UTC))  # 00:00 CET on the night of the change
    scheduler.create("sq-x", "g", datetime(2026, 3, 29, 9, 0), BERLIN, {"task_id": "x"}, "t")
    target = Recorder()
    clock.set(datetime(2026, 3, 29, 6, 59, 59, tzinfo=UTC))  # 08:59:59 CEST
    assert fire(target) == 0
    clock.set(datetime(2026, 3, 29, 7, 0, tzinfo=UTC))  # 09:00 CEST
    assert fire(target) == 1
    assert target.names == ["x"]


# --------------------------------------------------------------------------- firing
def test_nothing_fires_before_due_at(
    scheduler: Scheduler, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    make(scheduler, clock, "sq-a", seconds=600)
    target = Recorder()
    assert fire(target) == 0
    clock.advance(599.999)
    assert fire(target) == 0
    assert target.calls == []
    assert scheduler.get("sq-a") is not None


def test_a_due_schedule_fires_once_with_its_payload_and_is_deleted(
    scheduler: Scheduler, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    make(scheduler, clock, "sq-a", seconds=600)
    make(scheduler, clock, "sq-later", seconds=601)
    target = Recorder()
    clock.advance(600)
    assert fire(target) == 1
    assert target.calls == [{"task_id": "sq-a"}]
    assert scheduler.get("sq-a") is None
    assert scheduler.get("sq-later") is not None
    assert fire(target) == 0
    assert target.names == ["sq-a"]


def test_overdue_schedules_fire_in_due_order(
    scheduler: Scheduler, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    offsets = {"sq-c": 30, "sq-a": 90, "sq-e": 10, "sq-b": 70, "sq-d": 50}
    for name, seconds in offsets.items():
        make(scheduler, clock, name, seconds=seconds)
    clock.advance(3600)  # "downtime": all of them are overdue now
    target = Recorder()
    assert fire(target) == 5
    assert target.names == sorted(offsets, key=offsets.__getitem__)
    assert scheduler.list("g1") == []
    assert dead_letter_names(scheduler) == []


def test_a_failing_invocation_is_retried_then_dead_lettered_with_one_alarm(
    harness: Harness, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    scheduler = harness.scheduler
    make(scheduler, clock, "sq-bad", seconds=0, max_retries=2)
    make(scheduler, clock, "sq-good", seconds=0)
    target = Recorder(fail=lambda p: p["task_id"] == "sq-bad")

    assert fire(target) == 2
    retrying = scheduler.get("sq-bad")
    assert retrying is not None
    assert retrying.attempts == 1
    assert retrying.due_at > clock.now()  # backoff, not an immediate retry
    assert scheduler.get("sq-good") is None
    assert fire(target) == 0  # still backing off

    for attempt in (2, 3):
        clock.advance(3600)  # longer than any backoff
        assert fire(target) == 1
        if attempt == 2:
            again = scheduler.get("sq-bad")
            assert again is not None
            assert again.attempts == 2
            assert harness.alarm.letters == []

    assert target.names == ["sq-bad", "sq-good", "sq-bad", "sq-bad"]
    assert scheduler.get("sq-bad") is None
    [letter] = scheduler.dead_letters()
    assert letter.schedule_name == "sq-bad"
    assert letter.group == "g1"
    assert dict(letter.payload) == {"task_id": "sq-bad"}
    assert letter.attempts == 3
    assert "RuntimeError" in letter.error
    assert "boom sq-bad" in letter.error
    assert letter.failed_at == clock.now()
    assert harness.alarm.letters == [letter]

    clock.advance(3600)
    assert fire(target) == 0
    assert len(harness.alarm.letters) == 1


def test_max_retries_zero_dead_letters_at_the_first_failure(
    harness: Harness, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    make(harness.scheduler, clock, "sq-once", seconds=0, max_retries=0)
    assert fire(Recorder(fail=lambda _: True)) == 1
    assert harness.scheduler.get("sq-once") is None
    assert [letter.attempts for letter in harness.alarm.letters] == [1]


def test_backoff_grows_and_stays_within_the_cap(
    scheduler: Scheduler, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    make(scheduler, clock, "sq-bad", seconds=0, max_retries=10)
    delays = []
    for _ in range(9):
        fire(Recorder(fail=lambda _: True))
        current = scheduler.get("sq-bad")
        assert current is not None
        delays.append((current.due_at - clock.now()).total_seconds())
        clock.set(current.due_at)
    # Equal jitter: retry n waits between half and all of min(300, 5 * 2**(n-1)) seconds.
    for n, delay in enumerate(delays, start=1):
        ceiling = min(300.0, 5.0 * 2 ** (n - 1))
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 300.0


def test_a_retry_that_succeeds_deletes_the_schedule(
    harness: Harness, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    make(harness.scheduler, clock, "sq-flaky", seconds=0)
    failures = iter([True, False])
    target = Recorder(fail=lambda _: next(failures))
    assert fire(target) == 1
    clock.advance(3600)
    assert fire(target) == 1
    assert harness.scheduler.get("sq-flaky") is None
    assert harness.scheduler.dead_letters() == []
    assert harness.alarm.letters == []


def test_redrive_turns_a_dead_letter_into_a_schedule_due_now(
    harness: Harness, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    scheduler = harness.scheduler
    scheduler.create("sq-r", "camp", local(clock), BERLIN, {"task_id": "r"}, "tok", max_retries=0)
    fire(Recorder(fail=lambda _: True))
    [letter] = scheduler.dead_letters()
    assert scheduler.dead_letter(letter.id) == letter
    clock.advance(7200)

    redriven = scheduler.redrive(letter.id)
    assert redriven.name == "sq-r"
    assert redriven.group == "camp"
    assert dict(redriven.payload) == {"task_id": "r"}
    assert redriven.due_at == clock.now()
    assert redriven.client_token != "tok"
    assert redriven.attempts == 0
    assert redriven.timezone == BERLIN
    assert redriven.at_local == local(clock)
    assert scheduler.get("sq-r") == redriven
    assert scheduler.dead_letters() == []
    assert scheduler.dead_letter(letter.id) is None
    with pytest.raises(NotFound):
        scheduler.redrive(letter.id)

    target = Recorder()
    assert fire(target) == 1
    assert target.calls == [{"task_id": "r"}]
    assert scheduler.get("sq-r") is None


def test_redrive_of_an_unknown_letter_is_not_found(scheduler: Scheduler) -> None:
    assert scheduler.dead_letter("dl-nope") is None
    with pytest.raises(NotFound):
        scheduler.redrive("dl-nope")


def test_redrive_when_the_schedule_was_recreated_keeps_one_schedule(
    harness: Harness, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    scheduler = harness.scheduler
    make(scheduler, clock, "sq-r", seconds=0, max_retries=0, token="first")
    fire(Recorder(fail=lambda _: True))
    [letter] = scheduler.dead_letters()
    make(scheduler, clock, "sq-r", seconds=0, token="reconciled")  # e.g. by the reconciler
    assert scheduler.redrive(letter.id).client_token == "reconciled"
    assert scheduler.dead_letters() == []
    assert [s.name for s in scheduler.list("g1")] == ["sq-r"]


def test_a_schedule_replaced_during_its_invocation_survives(
    scheduler: Scheduler, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    # The worker reschedules a task from inside its own invocation: delete, then create anew.
    make(scheduler, clock, "sq-a", seconds=0, token="old")

    def reschedule(payload: Mapping[str, str]) -> None:
        scheduler.delete("sq-a")
        make(scheduler, clock, "sq-a", seconds=120, token="new")

    assert fire(reschedule) == 1
    survivor = scheduler.get("sq-a")
    assert survivor is not None
    assert survivor.client_token == "new"
    assert survivor.attempts == 0


def test_a_schedule_deleted_during_a_failing_invocation_is_not_retried(
    harness: Harness, clock: FakeClock, fire: Callable[[Target], int]
) -> None:
    scheduler = harness.scheduler
    make(scheduler, clock, "sq-a", seconds=0, max_retries=0)

    def cancel_then_fail(payload: Mapping[str, str]) -> None:
        scheduler.delete("sq-a")
        raise RuntimeError("after cancel")

    assert fire(cancel_then_fail) == 1
    assert scheduler.get("sq-a") is None
    assert scheduler.dead_letters() == []
    assert harness.alarm.letters == []
