"""Later steps made in batches (``FollowUps.make_due`` through ``BatchMaker``), on fakes and
a fake clock: the sends run with their next steps left marked, then one batch makes them.

A batch places them as one at a time would (same slots, same text), makes each once, makes
none for a sequence that stopped, takes the campaign's lease once, cancels only the step
whose template fails, and never breaks per_day nor comes before a step's delay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sendqueue.bootstrap import Container
from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.services.planning.replanning import iter_tasks
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, fake_app

STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts, {{ name }}?\n", None, parse_delay("2d")),
    Step(3, "Last note for {{ name }}", "Bye {{ name }}\n", None, parse_delay("1d")),
)
#: Mon-Fri, 09:00-17:00 UTC, 7 a day: 30 first steps take five sending days.
POLICY = SendingPolicy(
    timezone="UTC", per_day=7, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
)


def _rows(count: int) -> bytes:
    lines = ["email,name"] + [f"r{i}@example.com,R{i}" for i in range(count)]
    return ("\n".join(lines) + "\n").encode()


def _create(
    app: Container,
    count: int,
    *,
    steps: tuple[Step, ...] = STEPS,
    policy: SendingPolicy = POLICY,
    sender: bool = False,
    rows: bytes | None = None,
) -> str:
    senders = [app.senders.add(email="s@example.com", daily_cap=50).id] if sender else []
    created = app.campaign_import.create(
        name="seq",
        recipients=rows or _rows(count),
        policy=policy,
        from_addr="n@example.com",
        steps=steps,
        senders=senders,
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


@contextmanager
def _marks_kept(app: Container) -> Iterator[None]:
    """Sends inside leave their next steps marked, not made (as a worker whose runner has not
    run yet)."""

    def later(campaign_id: str, *, now: datetime) -> int:
        return 0

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(app.followups, "make_due", later)
        yield


def _tasks(app: Container, cid: str, step: int) -> dict[int, Task]:
    return {t.position: t for t in iter_tasks(app.store, cid) if t.step == step}


def _send_step(app: Container, clock: FakeClock, cid: str, step: int) -> None:
    """Fire the schedules until every task of ``step`` has been sent, next steps left marked."""
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    with _marks_kept(app):
        for _ in range(30 * 24 * 12):
            if all(t.state is TaskState.FINISHED for t in _tasks(app, cid, step).values()):
                return
            clock.advance(minutes=5)
            scheduler.fire_due(app.invoke)
    raise AssertionError(f"step {step} not all sent within 30 days")


def _one_at_a_time(app: Container, cid: str, now: datetime) -> None:
    """Make the marked steps' next steps each alone, in mark order, then clear the marks."""
    campaign = app.store.get_campaign(cid)
    marked = app.store.follow_ups_due(cid, limit=1000)
    for task in marked:
        assert task.sent_at is not None
        app.followups.after_sent(campaign, task, sent_at=task.sent_at, now=now)
    app.store.follow_ups_made(cid, [t.id for t in marked])


def _same_as_one_at_a_time(
    batch: Container, alone: Container, cids: tuple[str, str], step: int
) -> None:
    """The tasks of ``step`` are the same in both apps: slots as a whole, text per recipient."""
    made = [_tasks(app, cid, step) for app, cid in zip((batch, alone), cids, strict=True)]
    assert sorted(made[0]) == sorted(made[1]) == list(range(30))
    assert Counter(t.send_at for t in made[0].values()) == Counter(
        t.send_at for t in made[1].values()
    )
    for position, task in made[0].items():
        other = made[1][position]
        assert task.state is other.state is TaskState.PENDING
        assert (task.subject, task.text, task.sender_id is None) == (
            other.subject,
            other.text,
            other.sender_id is None,
        )


@pytest.mark.parametrize("sender", [False, True])
@pytest.mark.parametrize("count_steps", [2, 3])
def test_a_batch_gets_the_slots_and_text_of_making_each_step_alone(
    sender: bool, count_steps: int
) -> None:
    clocks = (FakeClock(T0), FakeClock(T0))
    apps = (fake_app(clock=clocks[0]), fake_app(clock=clocks[1]))
    steps = STEPS[:count_steps]
    cids = (
        _create(apps[0], 30, steps=steps, sender=sender),
        _create(apps[1], 30, steps=steps, sender=sender),
    )
    for step in range(1, count_steps):
        for app, clock, cid in zip(apps, clocks, cids, strict=True):
            _send_step(app, clock, cid, step)
        sent = [_tasks(app, cid, step) for app, cid in zip(apps, cids, strict=True)]
        assert {p: t.sent_at for p, t in sent[0].items()} == {
            p: t.sent_at for p, t in sent[1].items()
        }  # the two apps sent the same way: what follows compares only how they make
        assert clocks[0].now() == clocks[1].now()
        assert len(apps[0].store.follow_ups_due(cids[0], limit=1000)) == 30

        assert apps[0].followups.make_due(cids[0], now=clocks[0].now()) == 30
        _one_at_a_time(apps[1], cids[1], clocks[1].now())

        _same_as_one_at_a_time(apps[0], apps[1], cids, step + 1)
        made = _tasks(apps[0], cids[0], step + 1)
        # slots mattered: the next steps spread over several days of 7
        assert len({t.send_at.date() for t in made.values()}) >= 5
        for app, cid in zip(apps, cids, strict=True):
            assert app.store.follow_ups_due(cid) == []
    texts = {t.text for t in _tasks(apps[0], cids[0], 2).values()}
    assert "Any thoughts, R7?\n" in texts


def _marked_app(
    count: int = 10,
    *,
    steps: tuple[Step, ...] = STEPS[:2],
    sender: bool = False,
    rows: bytes | None = None,
) -> tuple[Container, FakeClock, str]:
    """An app whose campaign's first steps are all sent, their next steps marked, not made."""
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, count, steps=steps, sender=sender, rows=rows)
    _send_step(app, clock, cid, 1)
    assert len(app.store.follow_ups_due(cid, limit=1000)) == count
    return app, clock, cid


def test_a_batch_run_twice_makes_each_step_once_and_clears_the_marks() -> None:
    app, clock, cid = _marked_app()
    assert app.followups.make_due(cid, now=clock.now()) == 10
    made = _tasks(app, cid, 2)
    assert app.store.follow_ups_due(cid) == []
    assert app.followups.make_due(cid, now=clock.now()) == 0
    assert _tasks(app, cid, 2) == made
    assert app.store.count_tasks(cid)[TaskState.PENDING] == 10


def test_a_mark_whose_step_exists_already_is_cleared_and_its_step_kept() -> None:
    app, clock, cid = _marked_app()
    campaign = app.store.get_campaign(cid)
    firsts = _tasks(app, cid, 1)
    early = {}
    for position in (0, 4):  # made by a pass that died before clearing the marks
        sent = firsts[position]
        assert sent.sent_at is not None
        made = app.followups.after_sent(campaign, sent, sent_at=sent.sent_at, now=clock.now())
        assert made is not None
        early[position] = made

    assert app.followups.make_due(cid, now=clock.now()) == 8

    seconds = _tasks(app, cid, 2)
    assert sorted(seconds) == list(range(10))
    for position, task in early.items():
        kept = seconds[position]  # the same task, not made again nor moved
        assert (kept.token, kept.send_at, kept.state) == (task.token, task.send_at, task.state)
    assert len({t.send_at for t in seconds.values()}) == 10  # the batch took none of theirs
    assert app.store.follow_ups_due(cid) == []


def test_a_stopped_sequence_gets_no_next_step_and_its_mark_is_cleared() -> None:
    app, clock, cid = _marked_app(4, steps=STEPS)
    firsts = _tasks(app, cid, 1)
    app.store.set_outcome(firsts[0].id, TaskOutcome.REPLIED, detail="thanks", at=clock.now())
    app.suppression.add(firsts[1].email)

    assert app.followups.make_due(cid, now=clock.now()) == 2

    assert sorted(_tasks(app, cid, 2)) == [2, 3]
    assert app.store.follow_ups_due(cid) == []
    # an answer to an earlier step stops a later one too: step 2 of position 2 is sent, then
    # its step 1 is answered before the batch makes step 3
    _send_step(app, clock, cid, 2)
    app.store.set_outcome(firsts[2].id, TaskOutcome.BOUNCED, detail="5.1.1", at=clock.now())
    assert len(app.store.follow_ups_due(cid)) == 2
    assert app.followups.make_due(cid, now=clock.now()) == 1
    assert sorted(_tasks(app, cid, 3)) == [3]
    assert app.store.follow_ups_due(cid) == []


@pytest.mark.parametrize("sender", [False, True])
def test_a_batch_takes_the_campaigns_lease_once(
    monkeypatch: pytest.MonkeyPatch, sender: bool
) -> None:
    app, clock, cid = _marked_app(30, sender=sender)
    acquire = app.store.acquire_lease
    names: list[str] = []

    def counted(name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        names.append(name)
        return acquire(name, owner, ttl_seconds=ttl_seconds, at=at)

    monkeypatch.setattr(app.store, "acquire_lease", counted)
    assert app.followups.make_due(cid, now=clock.now()) == 30
    assert names.count(f"replan:{cid}") == 1


def test_a_template_that_fails_for_one_recipient_cancels_only_its_step() -> None:
    rows = b"email,name,n\n" + b"".join(
        b"r%d@example.com,R%d,%d\n" % (i, i, 0 if i == 2 else i + 1) for i in range(5)
    )
    steps = (STEPS[0], Step(2, None, "{{ 60 // (n | int) }}\n", None, parse_delay("1d")))
    app, clock, cid = _marked_app(5, steps=steps, rows=rows)

    assert app.followups.make_due(cid, now=clock.now()) == 5

    seconds = _tasks(app, cid, 2)
    failed = seconds.pop(2)
    assert failed.state is TaskState.CANCELLED
    assert failed.reason is not None and failed.reason.startswith("step 2: template failed")
    assert {p: (t.state, t.text) for p, t in seconds.items()} == {
        p: (TaskState.PENDING, f"{60 // (p + 1)}\n") for p in (0, 1, 3, 4)
    }
    names = {s.name for s in app.scheduler.list(f"sq-{cid}")}
    assert all(any(n.startswith(f"sq-{t.id}.") for n in names) for t in seconds.values())
    assert not any(n.startswith(f"sq-{failed.id}.") for n in names)
    assert app.store.follow_ups_due(cid) == []


#: First steps sent at any minute of a week, or not sent (those may be displaced).
_OFFSETS = st.lists(st.none() | st.integers(0, 7 * 1440), min_size=1, max_size=12).filter(
    lambda found: any(o is not None for o in found)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    offsets=_OFFSETS,
    per_day=st.integers(1, 5),
    cap=st.none() | st.integers(1, 5),
    delay=st.sampled_from(["30m", "2h", "1d", "2d"]),
)
# a late follow-up displaces a first step, which must not move onto another's new slot
@example(offsets=[None, 7704, None, None, 8571, None], per_day=1, cap=None, delay="1d")
def test_batch_made_slots_keep_per_day_and_come_after_each_steps_delay(
    offsets: list[int | None], per_day: int, cap: int | None, delay: str
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    policy = SendingPolicy(
        timezone="UTC", per_day=per_day, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
    )
    steps = (STEPS[0], Step(2, None, "Again\n", None, parse_delay(delay)))
    senders = [app.senders.add(email="s@example.com", daily_cap=cap).id] if cap else []
    cid = app.campaign_import.create(
        name="p", recipients=_rows(len(offsets)), policy=policy, steps=steps, senders=senders
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    firsts = _tasks(app, cid, 1)
    for position, offset in enumerate(offsets):
        if offset is not None:
            _send_at(app, firsts[position], T0 + timedelta(minutes=offset))
    last = max(T0 + timedelta(minutes=o) for o in offsets if o is not None)
    # the batch runs the next day: no send of that day or after was made outside a plan
    now = datetime.combine(last.date() + timedelta(days=1), datetime.min.time(), T0.tzinfo)
    clock.set(now)

    made = app.followups.make_due(cid, now=now)

    seconds = _tasks(app, cid, 2)
    assert made == len(seconds) == sum(o is not None for o in offsets)
    sent = _tasks(app, cid, 1)
    after = steps[1].after
    assert after is not None
    for position, task in seconds.items():
        sent_at = sent[position].sent_at
        assert sent_at is not None and task.state is TaskState.PENDING
        assert task.send_at >= max(now, follow_up_earliest(policy, sent_at, after)), position
        assert in_policy(policy, task.send_at)
    pending = [t.send_at for t in iter_tasks(app.store, cid, TaskState.PENDING) if t.send_at >= now]
    assert max(_per_day(pending).values()) <= per_day
    assert len(set(pending)) == len(pending)  # no two sends at one instant
    if cap:
        booked = app.stores.senders.booked_times(
            senders[0], since=now, until=now + timedelta(days=400)
        )
        assert max(_per_day(booked).values()) <= cap


def _per_day(instants: Sequence[datetime]) -> Counter[date]:
    return Counter(when.date() for when in instants)


def _send_at(app: Container, task: Task, at: datetime) -> None:
    """Record ``task`` sent at ``at`` as the worker does, its next step marked."""
    assert app.store.transition(task.id, TaskState.PENDING, TaskState.RUNNING, at=at)
    message_id = f"<{task_id(task.campaign_id, task.position, 1)}@example.com>"
    finish = app.store.finish_send(
        task.id, at=at, message_id=message_id, slot=task.send_at, follow_up=True
    )
    assert finish is not None
