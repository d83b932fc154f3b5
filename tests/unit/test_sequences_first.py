"""Follow-ups first, on fakes and a fake clock: with a long list booked ahead, every follow-up
still goes out within one sending day of its earliest instant, by taking a newer recipient's
first-step slot, and no cap (per_day, a sender's, a shared sender's) is exceeded."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import date, datetime, timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.followups_first import on_time_until
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Move, Task
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.services.planning.replanning import iter_tasks
from sendqueue.services.sequences.first import DISPLACED_REASON
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, csv_bytes, fake_app

STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts?\n", None, parse_delay("2d")),
)
#: Mon-Fri, 09:00-17:00 UTC.
POLICY = SendingPolicy(
    timezone="UTC", per_day=20, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
)


def _create(
    app: Container, count: int, *, policy: SendingPolicy = POLICY, senders: Sequence[str] = ()
) -> str:
    created = app.campaign_import.create(
        name="seq",
        recipients=csv_bytes(count),
        policy=policy,
        from_addr="n@example.com",
        steps=STEPS,
        senders=senders,
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _run(app: Container, clock: FakeClock, cids: Sequence[str], days: int) -> None:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    for _ in range(days * 24 * 12):
        clock.advance(minutes=5)
        scheduler.fire_due(app.invoke)
        if all(app.store.campaign_state(c) is CampaignState.COMPLETED for c in cids):
            return


def _tasks(app: Container, cid: str) -> list[Task]:
    return list(iter_tasks(app.store, cid))


def _check_follow_ups_on_time(app: Container, cid: str, policy: SendingPolicy) -> None:
    tasks = _tasks(app, cid)
    first = {t.position: t for t in tasks if t.step == 1}
    seconds = [t for t in tasks if t.step == 2]
    assert len(seconds) == len(first)
    for task in seconds:
        sent = first[task.position].sent_at
        assert sent is not None and task.state is TaskState.FINISHED
        earliest = follow_up_earliest(policy, sent, STEPS[1].after)  # type: ignore[arg-type]
        assert earliest <= task.send_at < on_time_until(policy, earliest), task.id


def _per_day(tasks: Sequence[Task], key: str | None = None) -> Counter[date]:
    return Counter(t.send_at.date() for t in tasks if key is None or t.sender_id == key)


def test_every_follow_up_of_a_long_list_goes_out_within_a_sending_day() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, 300)
    _run(app, clock, [cid], days=60)
    assert app.store.campaign_state(cid) is CampaignState.COMPLETED
    _check_follow_ups_on_time(app, cid, POLICY)
    tasks = _tasks(app, cid)
    assert len(tasks) == 600 and all(t.state is TaskState.FINISHED for t in tasks)
    assert max(_per_day(tasks).values()) <= 20
    assert all(in_policy(POLICY, t.send_at) for t in tasks)
    displaced = [t for t in tasks if t.moved_reason == DISPLACED_REASON]
    assert displaced and all(t.step == 1 for t in displaced)


def test_a_shared_sender_stays_within_its_cap_and_only_the_campaigns_own_first_steps_move() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    sender = app.senders.add(email="s@example.com", daily_cap=30, min_gap_seconds=60).id
    # the other campaign holds 10 of the sender's slots on the sequence's first days
    other = app.campaign_import.create(
        name="other",
        recipients=csv_bytes(30, prefix="other"),
        policy=SendingPolicy(
            timezone="UTC", per_day=10, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
        ),
        from_addr="n@example.com",
        senders=[sender],
    ).campaign.id
    assert app.provisioner.provision(other).status == "done"
    seq = _create(app, 120, senders=[sender])
    _run(app, clock, [seq, other], days=60)
    assert app.store.campaign_state(seq) is CampaignState.COMPLETED
    _check_follow_ups_on_time(app, seq, POLICY)
    mine, theirs = _tasks(app, seq), _tasks(app, other)
    assert max(_per_day(mine + theirs, sender).values()) <= 30
    assert max(_per_day(mine).values()) <= 20
    assert max(_per_day(theirs).values()) <= 10
    assert [t for t in mine if t.moved_reason == DISPLACED_REASON]
    assert not [t for t in theirs if t.moved_reason == DISPLACED_REASON]
    booked = app.stores.senders.booked_times(
        sender, since=T0 - timedelta(days=1), until=T0 + timedelta(days=400)
    )
    assert sorted(booked) == sorted(t.send_at for t in mine + theirs)  # one booking each
    # the sender's gaps hold over both campaigns
    times = sorted(t.send_at for t in mine + theirs)
    assert all(b - a >= timedelta(seconds=60) for a, b in itertools.pairwise(times))


def test_a_follow_up_with_room_on_its_day_takes_no_first_steps_slot() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, 10)  # 10 a day: room for every follow-up
    _run(app, clock, [cid], days=20)
    tasks = _tasks(app, cid)
    assert app.store.campaign_state(cid) is CampaignState.COMPLETED
    assert not [t for t in tasks if t.moved_reason == DISPLACED_REASON]
    _check_follow_ups_on_time(app, cid, POLICY)


@pytest.mark.parametrize("with_sender", [False, True])
def test_a_first_step_claimed_meanwhile_keeps_its_slot_and_the_follow_up_takes_a_free_one(
    monkeypatch: pytest.MonkeyPatch, with_sender: bool
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    senders = [app.senders.add(email="s@example.com", daily_cap=20).id] if with_sender else []
    cid = _create(app, 150, senders=senders)
    reschedule = app.store.reschedule
    lost: list[str] = []

    def lost_race(moves: Sequence[Move], *, at: datetime, reason: str) -> int:
        if reason == DISPLACED_REASON:
            lost.extend(m.task_id for m in moves)
            return 0  # as if each first step had been claimed between the read and the move
        return reschedule(moves, at=at, reason=reason)

    monkeypatch.setattr(app.store, "reschedule", lost_race)
    _run(app, clock, [cid], days=60)
    tasks = _tasks(app, cid)
    assert app.store.campaign_state(cid) is CampaignState.COMPLETED
    assert len(tasks) == 300 and all(t.state is TaskState.FINISHED for t in tasks)
    assert lost  # the rule tried, and lost every race
    assert not [t for t in tasks if t.moved_reason == DISPLACED_REASON]
    assert max(_per_day(tasks).values()) <= 20
    if with_sender:
        assert max(_per_day(tasks, senders[0]).values()) <= 20
        # every send holds one booking, at its own time: none left behind by a lost race
        booked = app.stores.senders.booked_times(
            senders[0], since=T0 - timedelta(days=1), until=T0 + timedelta(days=400)
        )
        assert sorted(booked) == sorted(t.send_at for t in tasks)


def test_in_a_local_time_campaign_follow_ups_are_on_time_in_their_recipients_zone() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    # two zones, one wall clock: the windows coincide, so a follow-up may take a first step's
    # slot of the other zone (a slot outside its own windows it never takes)
    zones = ["Europe/Berlin", "Europe/Amsterdam"]
    rows = [f"u{i}@example.com,{zones[i % 2]}" for i in range(160)]
    policy = SendingPolicy(
        timezone="Europe/Berlin",
        per_day=20,
        weekdays=frozenset(range(5)),
        windows=(Window(540, 1020),),
    )
    steps = (Step(1, "Hello", "Dear you\n", None, None), STEPS[1])
    cid = app.campaign_import.create(
        name="world",
        recipients=("email,timezone\n" + "\n".join(rows) + "\n").encode(),
        policy=policy,
        from_addr="n@example.com",
        steps=steps,
        local_time=True,
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    _run(app, clock, [cid], days=60)
    assert app.store.campaign_state(cid) is CampaignState.COMPLETED
    tasks = _tasks(app, cid)
    first = {t.position: t for t in tasks if t.step == 1}
    assert len(tasks) == 320 and all(t.state is TaskState.FINISHED for t in tasks)
    for task in tasks:
        zone = task.timezone
        assert in_policy(replace(policy, timezone=zone or policy.timezone), task.send_at)
        if task.step == 2:
            sent = first[task.position].sent_at
            assert sent is not None
            earliest = follow_up_earliest(policy, sent, STEPS[1].after, zone)  # type: ignore[arg-type]
            assert earliest <= task.send_at < on_time_until(policy, earliest, zone), task.id
    assert [t for t in tasks if t.moved_reason == DISPLACED_REASON]
