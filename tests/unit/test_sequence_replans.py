"""Re-plans keep a sequence's later steps after their delay: a catch-up after an outage and a
resume move the campaign's Pending emails onto free slots from now, but a later step due in the
future stays where its delay put it (pulled to now, it would follow the step before at once)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.ports import OutgoingMessage
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, fake_app, open_policy

STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts?\n", None, parse_delay("2h")),
)


def _campaign(
    app: Container, count: int, per_day: int = 10_000, senders: Sequence[str] = ()
) -> str:
    rows = "email,name\n" + "".join(f"r{i}@example.com,R{i}\n" for i in range(count))
    cid = app.campaign_import.create(
        name="seq",
        recipients=rows.encode(),
        policy=open_policy(per_day=per_day),
        from_addr="n@example.com",
        steps=STEPS,
        senders=senders,
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _fire(app: Container) -> int:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    return scheduler.fire_due(app.invoke)


def _sent(app: Container) -> list[OutgoingMessage]:
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    return list(mailer.sent)


def _second(app: Container, cid: str, position: int) -> Task:
    task = app.store.get_task(task_id(cid, position, 2))
    assert task is not None and task.state is TaskState.PENDING
    return task


@pytest.mark.parametrize("with_senders", [False, True])
def test_a_resume_leaves_a_later_step_after_its_delay(with_senders: bool) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    senders = [app.senders.add(email="s@example.com", daily_cap=50).id] if with_senders else []
    cid = _campaign(app, 2, senders=senders)
    clock.advance(minutes=5)
    assert _fire(app) == 2
    before = _second(app, cid, 0)
    assert before.send_at >= T0 + timedelta(hours=2)
    app.campaign_controls.pause(cid)
    clock.advance(minutes=10)
    app.campaign_controls.resume(cid)
    after = _second(app, cid, 0)
    assert after.send_at == before.send_at
    if with_senders:  # the pause freed its booking; the resume booked it again, in place
        assert app.capacity.booked(after)
    clock.advance(minutes=30)
    assert _fire(app) == 0  # its schedule is back, at its time, not now
    clock.advance(hours=2)
    assert _fire(app) == 2


def test_a_catch_up_moves_overdue_first_steps_but_not_a_later_step_due_later() -> None:
    clock = FakeClock(T0)
    # one send every ~15 minutes: the second recipient's step 1 is due after the first's
    app = fake_app(clock=clock, max_lateness=300.0)
    cid = _campaign(app, 2, per_day=96)
    first = app.store.get_task(task_id(cid, 0, 1))
    late = app.store.get_task(task_id(cid, 1, 1))
    assert first is not None and late is not None and late.send_at > first.send_at
    clock.set(first.send_at)
    assert _fire(app) == 1
    before = _second(app, cid, 0)
    clock.set(late.send_at + timedelta(minutes=20))  # the worker was down: step 1 is overdue
    assert app.recovery.catch_up_overdue() >= 1
    moved = app.store.get_task(late.id)
    assert moved is not None and moved.send_at >= clock.now()
    assert _second(app, cid, 0).send_at == before.send_at


def test_a_later_step_waits_for_a_step_before_it_that_was_never_recorded_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, stale_after=600.0)
    cid = _campaign(app, 1)
    first_id = task_id(cid, 0, 1)
    finish = app.store.finish_send

    def died(task: str, **kwargs: Any) -> Any:
        if task == first_id:  # the worker died after the send, before recording it
            raise StoreUnavailable("the worker died")
        return finish(task, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(app.store, "finish_send", died)
        clock.advance(minutes=5)
        with contextlib.suppress(StoreUnavailable):
            _fire(app)
    running = app.store.get_task(first_id)
    assert running is not None and running.state is TaskState.RUNNING
    # a next step is made only once its step is recorded sent (the finish marks it) ...
    assert app.store.get_task(task_id(cid, 0, 2)) is None
    # ... but a worker of a version that made it before the record left one behind
    made = app.followups.after_sent(app.store.get_campaign(cid), running, sent_at=clock.now())
    assert made is not None
    second = _second(app, cid, 0)

    clock.set(second.send_at)  # step 2 is due while step 1 is still Running: it waits
    assert _fire(app) >= 1  # (step 1's failed fire is tried again too: Running, skipped)
    held = _second(app, cid, 0)
    assert held.send_at >= clock.now() + timedelta(hours=2)
    assert held.attempts == second.attempts
    assert [m.to_addr for m in _sent(app)] == ["r0@example.com"]  # step 1 only

    clock.advance(minutes=10)  # step 1 is stale: sent again, and step 2 follows it by 2 hours
    app.reconciler.run()
    clock.advance(minutes=5)  # its retry slot
    assert _fire(app) >= 1
    first = app.store.get_task(first_id)
    assert first is not None and first.state is TaskState.FINISHED and first.sent_at is not None
    after = _second(app, cid, 0)
    assert after.send_at >= first.sent_at + timedelta(hours=2)
    clock.set(after.send_at)
    assert _fire(app) == 1
    mail = _sent(app)
    assert len(mail) == 3 and mail[2].headers["In-Reply-To"] == first.message_id
