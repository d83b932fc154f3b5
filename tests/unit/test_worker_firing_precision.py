"""An execution layer that fires to the minute (EventBridge Scheduler) may invoke a task's
schedule anywhere in the minute of its time: the worker sends from the start of that minute and
still skips anything earlier. An exact layer keeps the one-second tolerance."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task
from sendqueue.services.scheduling.schedules import send_payload
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, csv_bytes, fake_app, open_policy


class MinuteScheduler(FakeScheduler):
    """The fake layer, declaring EventBridge's precision (the port's optional attribute)."""

    firing_precision = 60.0


def _app(clock: FakeClock, scheduler: FakeScheduler | None = None) -> Container:
    return fake_app(clock=clock, scheduler=scheduler or FakeScheduler(clock, seed=1))


def _late_in_its_minute(app: Container) -> Task:
    """A provisioned task whose send time lies well into its minute (the open policy sends
    every 8.64 s from 08:00:00)."""
    cid = app.campaign_import.create(
        name="t", recipients=csv_bytes(4), policy=open_policy()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    task = app.store.list_tasks(cid, limit=10)[3]
    assert task.send_at.second >= 20, task.send_at
    return task


def _minute_of(task: Task) -> timedelta:
    return timedelta(seconds=task.send_at.second, microseconds=task.send_at.microsecond)


def test_the_worker_is_given_the_layers_precision() -> None:
    clock = FakeClock(T0)
    assert _app(clock, MinuteScheduler(clock, seed=1)).worker._config.firing_precision == 60.0
    assert _app(clock).worker._config.firing_precision == 0.0


@pytest.mark.parametrize("before_the_minute", [timedelta(0), timedelta(milliseconds=900)])
def test_a_minute_layer_invocation_from_the_start_of_the_minute_sends(
    before_the_minute: timedelta,
) -> None:
    clock = FakeClock(T0)
    app = _app(clock, MinuteScheduler(clock, seed=1))
    task = _late_in_its_minute(app)
    clock.set(task.send_at - _minute_of(task) - before_the_minute)
    app.worker.send(send_payload(task))
    done = app.store.get_task(task.id)
    assert done is not None and done.state is TaskState.FINISHED
    assert done.sent_at is not None and done.sent_at < task.send_at
    assert len(app.mailer.sent) == 1  # type: ignore[attr-defined]


def test_a_minute_layer_invocation_before_the_minute_is_still_skipped() -> None:
    clock = FakeClock(T0)
    app = _app(clock, MinuteScheduler(clock, seed=1))
    task = _late_in_its_minute(app)
    clock.set(task.send_at - _minute_of(task) - timedelta(seconds=1, milliseconds=100))
    app.worker.send(send_payload(task))
    assert app.mailer.sent == []  # type: ignore[attr-defined]
    assert app.store.get_task(task.id).state is TaskState.PENDING  # type: ignore[union-attr]


def test_an_exact_layer_still_skips_an_invocation_at_the_start_of_the_minute() -> None:
    clock = FakeClock(T0)
    app = _app(clock)
    task = _late_in_its_minute(app)
    clock.set(task.send_at - _minute_of(task))
    app.worker.send(send_payload(task))
    assert app.mailer.sent == []  # type: ignore[attr-defined]
    assert app.store.get_task(task.id).state is TaskState.PENDING  # type: ignore[union-attr]
