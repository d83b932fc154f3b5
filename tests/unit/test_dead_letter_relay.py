"""The dead-letter relay on the fakes: the execution layer's dead letters are its outbox, and
the relay copies them into the change log once per letter id, from the delivery pass
(throttled), the alarm and every redrive; a letter no alarm relayed (its process was killed
first) still makes exactly one ``dead_letter`` event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from sendqueue.domain.errors import NotFound, SchedulerError, StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, DeadLetter
from sendqueue.domain.webhooks import DEAD_LETTER
from sendqueue.services.operations.dead_letters import DeadLetterQueue
from sendqueue.services.webhooks import (
    DeadLetterLog,
    DeadLetterRelay,
    WebhookDelivery,
    WebhookService,
)
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.testing.tasks import bare_task
from tests.support.app import T0, open_policy
from tests.unit.test_webhooks import CID, Receiver


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingScheduler(FakeScheduler):
    """Counts the listings of the dead-letter queue; ``down`` makes them fail."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.listings = 0
        self.down = False

    def dead_letters(self, *, limit: int = 1000) -> list[DeadLetter]:
        self.listings += 1
        if self.down:
            raise SchedulerError("the scheduler database is locked")
        return super().dead_letters(limit=limit)


class CountingStore(InMemoryTaskStore):
    """Counts relay calls."""

    relays = 0

    def relay_dead_letters(self, letters: Any) -> list[str]:
        self.relays += 1
        return super().relay_dead_letters(letters)


def _bury(scheduler: FakeScheduler, position: int, payload: dict[str, str] | None = None) -> str:
    """A send of task ``position`` that fails at once: a dead letter, written with no event
    (the fake scheduler's alarm only records it, as if the process died before relaying)."""
    name = f"sq-{CID}-{position}.0"
    scheduler.create(
        name,
        f"sq-{CID}",
        datetime(2026, 1, 1),
        "UTC",
        payload if payload is not None else {"task_id": f"{CID}-{position}"},
        f"tok{position}",
        max_retries=0,
    )

    def fail(_: Any) -> None:
        raise StoreUnavailable("store down")

    scheduler.fire_due(fail)
    [letter] = [d for d in scheduler.dead_letters() if d.schedule_name == name]
    return letter.id


class Relayed:
    """An endpoint, a campaign of three Pending tasks, and an execution layer whose letters
    the delivery pass relays."""

    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.store = CountingStore()
        self.receiver = Receiver()
        self.scheduler = CountingScheduler(self.clock)
        self.monotonic = Clock()
        self.relay = self.new_relay()
        self.delivery = WebhookDelivery(
            self.store, self.store, self.receiver, self.clock, relay=self.relay
        )
        service = WebhookService(
            self.store, self.store, self.clock, self.delivery, production=False
        )
        service.add("http://hooks.example.com/in")
        campaign = Campaign(
            id=CID,
            name="c",
            policy=open_policy(),
            from_addr="a@example.com",
            state=CampaignState.ACTIVE,
        )
        self.store.create_campaign(campaign, [])
        self.store.insert_tasks([bare_task(CID, p, T0) for p in range(3)], at=T0)

    def new_relay(self) -> DeadLetterRelay:
        """A relay as a fresh process has it: nothing remembered."""
        return DeadLetterRelay(
            lambda: self.scheduler, lambda: self.store, interval=5.0, monotonic=self.monotonic
        )

    def dead_letter_events(self) -> list[tuple[str, str]]:
        return [
            (h["webhook-id"], b["data"]["task_id"])  # type: ignore[index]
            for _, h, b in self.receiver.got
            if b["type"] == "dead_letter"
        ]


@pytest.fixture
def world() -> Relayed:
    return Relayed()


def test_a_letter_no_alarm_relayed_makes_one_event_on_the_next_pass(world: Relayed) -> None:
    _bury(world.scheduler, 0)
    assert world.delivery.run_pass().delivered == 1
    [(event, task)] = world.dead_letter_events()
    assert task == f"{CID}-0"
    # more passes, and a fresh process's relay over the same queue: still one event
    world.monotonic.now += 60
    world.delivery.run_pass()
    fresh = WebhookDelivery(
        world.store, world.store, world.receiver, world.clock, relay=world.new_relay()
    )
    fresh.run_pass()
    assert world.dead_letter_events() == [(event, f"{CID}-0")]
    entries = world.store.changes_after(0, limit=1000)
    assert [e.task_id for e in entries if e.to_state == DEAD_LETTER] == [f"{CID}-0"]


def test_the_pass_lists_the_queue_at_most_once_per_interval(world: Relayed) -> None:
    world.delivery.run_pass()
    world.delivery.run_pass()
    assert world.scheduler.listings == 1
    _bury(world.scheduler, 1)
    world.monotonic.now += 4.9
    world.delivery.run_pass()
    assert world.dead_letter_events() == []  # not listed yet
    world.monotonic.now += 0.1
    world.delivery.run_pass()
    assert [t for _, t in world.dead_letter_events()] == [f"{CID}-1"]
    assert world.scheduler.listings == 3  # counted after _bury's own listing
    # letters relayed before cost no store call, only the listing
    relays = world.store.relays
    world.monotonic.now += 5
    world.delivery.run_pass()
    assert world.store.relays == relays


def test_a_relay_that_fails_does_not_stop_the_deliveries(world: Relayed) -> None:
    _bury(world.scheduler, 0)
    world.scheduler.down = True
    world.store.transition(f"{CID}-2", TaskState.PENDING, TaskState.CANCELLED, at=T0)
    report = world.delivery.run_pass()
    assert report.delivered == 1 and world.dead_letter_events() == []  # the cancel only
    world.scheduler.down = False
    world.monotonic.now += 5
    world.delivery.run_pass()
    assert [t for _, t in world.dead_letter_events()] == [f"{CID}-0"]


def test_the_alarm_relays_at_once_and_the_next_pass_adds_nothing(world: Relayed) -> None:
    recorded = RecordingAlarm()
    world.scheduler.alarm = DeadLetterLog(recorded, world.relay)
    world.delivery.run_pass()  # the relay's first run: nothing yet
    letter = _bury(world.scheduler, 0)
    assert [d.id for d in recorded.letters] == [letter]
    world.delivery.run_pass()  # within the interval: the alarm relayed it
    assert [t for _, t in world.dead_letter_events()] == [f"{CID}-0"]
    world.monotonic.now += 5
    world.delivery.run_pass()
    assert len(world.dead_letter_events()) == 1


def test_a_letter_of_no_task_is_never_sent_to_the_store(world: Relayed) -> None:
    _bury(world.scheduler, 9, payload={"kind": "provision", "campaign_id": CID})
    world.delivery.run_pass()
    assert world.store.relays == 0 and world.dead_letter_events() == []


def test_a_redrive_relays_a_letter_no_run_met_before_removing_it(world: Relayed) -> None:
    first, second = _bury(world.scheduler, 0), _bury(world.scheduler, 1)
    queue = DeadLetterQueue(world.scheduler, world.new_relay().relay)
    queue.redrive(first)
    assert world.scheduler.dead_letter(first) is None
    report = queue.redrive_all()
    assert report.redriven == [second] and world.scheduler.dead_letters() == []
    world.delivery.run_pass()
    assert sorted(t for _, t in world.dead_letter_events()) == [f"{CID}-0", f"{CID}-1"]
    with pytest.raises(NotFound):
        queue.redrive(first)


def test_a_redrive_into_a_store_that_is_down_removes_nothing(world: Relayed) -> None:
    letter = _bury(world.scheduler, 0)
    queue = DeadLetterQueue(world.scheduler, world.new_relay().relay)
    world.store.set_available(False)
    with pytest.raises(StoreUnavailable):
        queue.redrive(letter)
    with pytest.raises(StoreUnavailable):
        queue.redrive_all()
    assert [d.id for d in world.scheduler.dead_letters()] == [letter]
    world.store.set_available(True)
    queue.redrive(letter)
    world.delivery.run_pass()
    assert [t for _, t in world.dead_letter_events()] == [f"{CID}-0"]


def test_a_process_remembers_only_the_newest_letters_it_relayed() -> None:
    store = CountingStore()
    relay = DeadLetterRelay(lambda: FakeScheduler(FakeClock(T0)), lambda: store, remember=2)
    letters = [
        DeadLetter(f"dl-{n}", "sq-x.0", "g", {"task_id": f"t-{n}"}, "e", 3, T0) for n in range(3)
    ]
    relay.relay(letters)
    assert store.relays == 1
    relay.relay(letters[1:])  # remembered: no store call
    assert store.relays == 1
    relay.relay(letters[:1])  # forgotten: asked again (the store keeps it relayed once)
    assert store.relays == 2


def test_the_entry_time_is_the_failure_time(world: Relayed) -> None:
    world.clock.advance(minutes=3)
    _bury(world.scheduler, 0)
    failed_at = world.clock.now()
    world.clock.advance(hours=1)
    world.delivery.run_pass()
    [entry] = [e for e in world.store.changes_after(0) if e.to_state == DEAD_LETTER]
    assert entry.at == failed_at
