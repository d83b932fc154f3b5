"""The reconciler racing a sending worker (issue 16), played the same way on every layer.

A held-back procrastinate run caught it: a pass listed a campaign's Pending tasks, a worker then
sent some of them (their schedules deleted themselves once the invocation returned), and the
pass, finding no schedule for tasks it still held as Pending, "repaired" them; they fired
twice and the log warned of repairs that never happened. Here a :class:`Meanwhile` store lets
the layer's dispatcher fire the due schedules right after the reconciler's listing, so the race
happens every time. The stale-Running path gets the same treatment: the task a pass read as
stale finishes, or is given back and claimed again, before the pass acts on it.

:class:`RaceScenarios` holds the scenarios as tests; each layer's test module subclasses it
beside a ``build`` fixture (the fakes, the embedded layer and procrastinate, DynamoDB with
EventBridge).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Move, Task, expected_schedule_name, new_token
from sendqueue.ports import Target
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.support.app import csv_bytes, open_policy
from tests.support.faults import Meanwhile

__all__ = [
    "Build",
    "Layer",
    "RaceScenarios",
    "fired_through",
    "listing_races_a_send",
    "recreate_races_a_re_plan",
    "stale_read_races_the_worker",
]

LOGGER = "sendqueue.services.scheduling.reconciler"


@dataclass
class Layer:
    """One execution layer and store under test, on a fake clock.

    ``fire`` runs the layer's dispatcher once at the clock's now (every due schedule, each
    invocation to the send worker) and returns the ids of the tasks it invoked.
    ``app.store`` must be ``store``.
    """

    app: Container
    store: Meanwhile
    clock: FakeClock
    mailer: RecordingMailer
    fire: Callable[[], list[str]]


#: A test module's ``build`` fixture: makes a :class:`Layer`, its keyword arguments settings.
Build = Callable[..., Layer]


def fired_through(app: Container, fire_due: Callable[[Target], object]) -> Callable[[], list[str]]:
    """:attr:`Layer.fire` for a layer dispatched by ``fire_due(target)``: each due schedule to
    ``app``'s send worker, the ids of the tasks invoked returned."""

    def fire() -> list[str]:
        invoked: list[str] = []

        def target(payload: Mapping[str, str]) -> None:
            invoked.append(payload["task_id"])
            app.invoke(payload)

        fire_due(target)
        return invoked

    return fire


def _campaign(layer: Layer, count: int) -> list[Task]:
    app = layer.app
    cid = app.campaign_import.create(
        name="race", recipients=csv_bytes(count), policy=open_policy(start=layer.clock.now())
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    tasks = app.store.list_tasks(cid)
    assert len(tasks) == count
    return tasks


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING
    ]


def listing_races_a_send(layer: Layer, caplog: pytest.LogCaptureFixture, *, lost: bool) -> None:
    """Three of six tasks are sent between the pass's task listing and its schedule listing;
    with ``lost``, the last task's schedule was also really lost before the pass."""
    app, clock = layer.app, layer.clock
    tasks = _campaign(layer, 6)
    if lost:
        app.scheduler.delete(expected_schedule_name(tasks[5]))  # behind the layer's back
    clock.set(tasks[2].send_at + timedelta(seconds=1))  # 8.64 s apart: three are due
    sent = tasks[:3]
    invoked: Counter[str] = Counter()
    layer.store.arm("list_tasks", lambda: invoked.update(layer.fire()))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report = app.reconciler.run()
    assert invoked == Counter(t.id for t in sent), "the worker did not send meanwhile"

    # Only the real loss is repaired, counted and warned about.
    assert report.missing_schedules_created == int(lost), report.as_dict()
    assert report.repairs == int(lost), report.as_dict()
    for task in sent:
        assert app.store.get_task(task.id).state is TaskState.FINISHED  # type: ignore[union-attr]
        assert app.scheduler.get(expected_schedule_name(task)) is None, "recreated"
    warnings = _warnings(caplog)
    if lost:
        assert warnings == ["reconciler made 1 repair: 1 missing schedule created"]
    else:
        assert warnings == []
    assert report.skipped_in_flight == 3, report.as_dict()
    assert any(
        r.name == LOGGER and r.levelno == logging.INFO and "left 3 alone" in r.getMessage()
        for r in caplog.records
    )

    # Nothing fires twice: every task is invoked once and sent once.
    clock.set(tasks[-1].send_at + timedelta(seconds=1))
    invoked.update(layer.fire())
    assert invoked == Counter(t.id for t in tasks), "a task was invoked twice"
    assert sorted(m.to_addr for m in layer.mailer.sent) == sorted(t.email for t in tasks)
    assert app.reconciler.run().missing_schedules_created == 0


def stale_read_races_the_worker(
    layer: Layer, caplog: pytest.LogCaptureFixture, *, meanwhile: str
) -> None:
    """A task claimed longer than ``stale_after`` ago is read as stale; before the pass acts,
    its slow worker ``finished`` it, or gave it back and it was ``reclaimed`` (a new attempt
    now in flight). The pass must leave it alone either way."""
    app, clock = layer.app, layer.clock
    tasks = _campaign(layer, 2)
    task = tasks[0]
    clock.set(task.send_at)
    claimed = app.store.transition(
        task.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now(),
        changes={"claimed_at": clock.now(), "attempts": 1},
    )  # fmt: skip
    assert claimed is not None
    app.scheduler.delete(expected_schedule_name(task))  # in flight: the invocation's own
    clock.advance(seconds=app.config.stale_after + 1)

    def finished() -> None:
        assert app.store.transition(
            task.id, TaskState.RUNNING, TaskState.FINISHED, at=clock.now(),
            changes={"sent_at": clock.now()},
        )  # fmt: skip

    def reclaimed() -> None:
        back = app.store.transition(
            task.id, TaskState.RUNNING, TaskState.PENDING, at=clock.now(),
            changes={"send_at": clock.now(), "token": new_token()},
        )  # fmt: skip
        assert back is not None
        assert app.store.transition(
            task.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now(),
            changes={"claimed_at": clock.now(), "attempts": 2},
        )  # fmt: skip

    layer.store.arm("stale_running", {"finished": finished, "reclaimed": reclaimed}[meanwhile])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report = app.reconciler.run()
    after = app.store.get_task(task.id)
    assert after is not None
    assert (report.stale_retried, report.stale_failed) == (0, 0), report.as_dict()
    if meanwhile == "finished":
        assert after.state is TaskState.FINISHED
    else:
        assert (after.state, after.attempts, after.claimed_at) == (
            TaskState.RUNNING, 2, clock.now(),
        )  # fmt: skip
    assert report.skipped_in_flight == 1, report.as_dict()
    assert _warnings(caplog) == []


def recreate_races_a_re_plan(layer: Layer) -> None:
    """Between the pass's re-read of a task whose schedule is missing and its create, the task
    is re-planned (same name, new token) and given its schedule. The pass's create meets that
    schedule under another token: it must keep it, not replace it with one carrying the token
    the task no longer holds (skipped as stale when it fires: the email late by a pass)."""
    app, clock = layer.app, layer.clock
    tasks = _campaign(layer, 3)
    task = tasks[1]
    app.scheduler.delete(expected_schedule_name(task))  # lost behind the layer's back
    moved: list[Task] = []

    def re_planned() -> None:
        later = task.send_at + timedelta(minutes=5)
        move = Move(task.id, task.token, later, new_token())
        assert app.store.reschedule([move], at=clock.now(), reason="re-plan")
        current = app.store.get_task(task.id)
        assert current is not None
        app.writer.ensure(current)
        moved.append(current)

    layer.store.arm("get_tasks", re_planned)  # the re-check reads the candidates' tasks
    report = app.reconciler.run()
    assert moved, "the re-plan did not run between the re-check and the create"
    schedule = app.scheduler.get(expected_schedule_name(task))
    assert schedule is not None and schedule.client_token == moved[0].token
    assert (report.missing_schedules_created, report.skipped_in_flight) == (0, 1), report.as_dict()


class RaceScenarios:
    """The scenarios as tests, for a test module to subclass (as ``Test...``) beside its own
    ``build`` fixture (a :data:`Build`), one per layer."""

    @pytest.mark.parametrize("lost", [False, True], ids=["race-only", "race-and-a-real-loss"])
    def test_a_schedule_that_went_with_its_sent_task_is_not_recreated(
        self, build: Build, lost: bool, caplog: pytest.LogCaptureFixture
    ) -> None:
        listing_races_a_send(build(), caplog, lost=lost)

    @pytest.mark.parametrize("policy", ["retry", "fail"])
    @pytest.mark.parametrize("meanwhile", ["finished", "reclaimed"])
    def test_a_stale_task_that_moved_on_since_the_read_is_left_alone(
        self, build: Build, policy: str, meanwhile: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        layer = build(stale_policy=policy, stale_after=900)
        stale_read_races_the_worker(layer, caplog, meanwhile=meanwhile)

    def test_a_schedule_made_after_the_recheck_is_not_replaced_by_the_passs_older_read(
        self, build: Build
    ) -> None:
        recreate_races_a_re_plan(build())
