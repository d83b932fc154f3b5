"""Emails due within SENDQUEUE_MAX_LATENESS never go out in a burst (issue 12: "two emails of a
campaign are never closer than half the planned spacing"), on a fake clock.

The campaign of tests/unit/test_catch_up.py: a window 16:00-17:00 (Berlin), 12 a day, one every
5 minutes (half the spacing: 150 s).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from datetime import datetime, timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import (
    Move,
    Task,
    expected_schedule_name,
    new_token,
    schedule_group,
)
from sendqueue.domain.slots import in_policy, nominal_spacing
from sendqueue.services.scheduling.schedules import send_payload
from sendqueue.services.sending.worker import FIRING_SLACK
from sendqueue.testing.clock import FakeClock
from tests.unit.test_catch_up import (
    BERLIN,
    POLICY,
    START,
    _app,
    _campaign,
    _fake,
    _one_schedule_per_pending_task,
    _sent,
    _tasks,
    local,
)

GAP = nominal_spacing(POLICY) / 2


def _no_burst_to_the_end(app: Container, clock: FakeClock, cid: str, count: int = 24) -> None:
    """Run every schedule at its time to the end: all sent once, in the windows, within the
    cap, no two sends closer than half the spacing."""
    _fake(app).run_until(clock, app.invoke, local("2026-12-06T00:00"))
    sent = sorted(_sent(app))
    assert len(sent) == count
    assert all(in_policy(POLICY, s) for s in sent)
    assert max(Counter(s.astimezone(BERLIN).date() for s in sent).values()) <= POLICY.per_day
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= GAP, sent
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_emails_due_together_within_max_lateness_go_out_one_now_and_the_rest_moved() -> None:
    """The worker is back at 16:32 after half an hour down: seven emails (16:00 ... 16:30) are
    due, none late by max_lateness (an hour), all fired at once."""
    clock = FakeClock(START)
    app = _app(clock, max_lateness=3600)
    cid = _campaign(app)
    clock.set(local("2026-12-01T16:32"))
    now = clock.now()
    _fake(app).fire_due(app.invoke)

    assert _sent(app) == [now]  # one goes out at once, not seven
    assert app.metrics.value("sendqueue_sends_total", outcome="moved") == 1
    pending = [t for t in _tasks(app, cid) if t.state is TaskState.PENDING]
    assert len(pending) == 23
    assert all(t.send_at - now >= GAP for t in pending)
    reasons = {t.moved_reason for t in pending if t.moves}
    # the first to fire (16:00 Berlin, 15:00 UTC) names why: it fired late, not where it would
    assert reasons == {"fired late 15:00\u201315:32 UTC"}
    assert max(t.moves for t in _tasks(app, cid)) == 1
    given_back = [t for t in pending if t.planned_at == local("2026-12-01T16:00")]
    assert [t.attempts for t in given_back] == [0]  # the give-back does not count an attempt
    _one_schedule_per_pending_task(app, cid)
    _no_burst_to_the_end(app, clock, cid)


def test_a_late_send_right_before_an_on_time_one_is_moved() -> None:
    """16:05's email fires at 16:09 (late, not overdue); 16:10's is due in a minute: both now
    would be 60 s apart, under half the spacing."""
    clock = FakeClock(START)
    app = _app(clock, max_lateness=3600)
    cid = _campaign(app)
    _fake(app).run_until(clock, app.invoke, local("2026-12-01T16:00"))
    assert len(_sent(app)) == 1
    clock.set(local("2026-12-01T16:09"))
    _fake(app).fire_due(app.invoke)
    assert len(_sent(app)) == 1
    task = app.store.get_task(f"{cid}-1")
    assert task is not None and task.state is TaskState.PENDING and task.moves == 1
    # nothing goes out now: the late one takes the next slot, and the rest follow by one
    assert task.send_at == local("2026-12-01T16:10")
    assert [t.send_at for t in _tasks(app, cid)][2:4] == [
        local("2026-12-01T16:15"),
        local("2026-12-01T16:20"),
    ]
    _one_schedule_per_pending_task(app, cid)
    _no_burst_to_the_end(app, clock, cid)


def test_two_late_sends_claimed_at_once_are_not_both_sent() -> None:
    """Two invocations of late emails, each claimed before either looks for neighbours (the
    store's first two ``booked`` reads wait for each other): each sees the other's claim."""
    clock = FakeClock(START)
    app = _app(clock, max_lateness=3600)
    cid = _campaign(app)
    clock.set(local("2026-12-01T16:07"))
    store = app.store
    booked = store.booked
    barrier = threading.Barrier(2, timeout=10)
    calls: list[int] = []
    lock = threading.Lock()

    def both_claimed_first(
        campaign_id: str, *, since: datetime, until: datetime | None = None
    ) -> list[tuple[TaskState, datetime]]:
        with lock:
            calls.append(1)
            first_two = len(calls) <= 2
        if first_two:
            barrier.wait()
        return booked(campaign_id, since=since, until=until)

    store.booked = both_claimed_first  # type: ignore[method-assign]
    tasks = sorted(_tasks(app, cid), key=lambda t: t.send_at)[:2]  # 16:00's and 16:05's
    threads = [
        threading.Thread(
            target=app.invoke, args=({"kind": "send", "task_id": t.id, "token": t.token},)
        )
        for t in tasks
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    store.booked = booked  # type: ignore[method-assign]

    # Neither goes out from its own claim (each was claimed when the other looked); the
    # re-plans that follow may leave one of them, given back, to go out now (nothing is left
    # near now once the other is moved), never both.
    assert len(_sent(app)) <= 1
    after = {t.id: t for t in _tasks(app, cid)}
    assert sum(after[t.id].state is TaskState.PENDING for t in tasks) >= 1
    for t in tasks:
        if after[t.id].state is TaskState.PENDING:
            assert after[t.id].moves >= 1
            assert after[t.id].send_at - clock.now() >= GAP
    # every Pending task has its schedule; one kept and sent at once may leave its re-made
    # schedule behind, which the worker skips (final) and the reconciler deletes (orphan)
    schedules = {s.name: s for s in app.scheduler.list(schedule_group(cid))}
    for t in after.values():
        if t.state is TaskState.PENDING:
            assert schedules[expected_schedule_name(t)].client_token == t.token
        elif expected_schedule_name(t) in schedules:
            assert t.state.is_final
    _no_burst_to_the_end(app, clock, cid)


def _count_booked_reads(app: Container) -> list[str]:
    """Record the campaign id of every ``booked`` read of the app's store from now on."""
    booked = app.store.booked
    reads: list[str] = []

    def counting(
        campaign_id: str, *, since: datetime, until: datetime | None = None
    ) -> list[tuple[TaskState, datetime]]:
        reads.append(campaign_id)
        return booked(campaign_id, since=since, until=until)

    app.store.booked = counting  # type: ignore[method-assign]
    return reads


def test_an_on_time_send_reads_no_neighbours() -> None:
    """The check for neighbours is for late sends only: on time, no extra store read."""
    clock = FakeClock(START)
    app = _app(clock)
    _campaign(app, count=6)
    reads = _count_booked_reads(app)
    _fake(app).run_until(clock, app.invoke, local("2026-12-02T00:00"))
    assert len(_sent(app)) == 6
    assert reads == []


def test_a_send_past_the_firing_slack_reads_its_neighbours_once() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app, count=2)
    reads = _count_booked_reads(app)
    clock.set(local("2026-12-01T16:00") + FIRING_SLACK + timedelta(milliseconds=1))
    _fake(app).fire_due(app.invoke)
    assert len(_sent(app)) == 1
    assert reads == [cid]


def test_a_task_moved_between_the_workers_read_and_its_claim_is_not_sent_by_the_old_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race the procrastinate outage run hit: the worker read the task (old token), a
    re-plan elsewhere moved it (new token, new schedule), then the claim (on the state only)
    won. The stale invocation must not send; the task goes back as it was and its new
    schedule sends it once, at its new time."""
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app)
    first = min(_tasks(app, cid), key=lambda t: t.send_at)
    clock.set(first.send_at)
    stale_payload = send_payload(first)
    moved_to = first.send_at + GAP  # between it and the next one, 16:05
    store = app.store
    real_get = store.get_task

    def read_then_moved(task_id: str) -> Task | None:
        seen = real_get(task_id)  # the worker's read: the old token
        assert (
            store.reschedule(
                [Move(first.id, first.token, moved_to, new_token())], at=clock.now(), reason="test"
            )
            == 1
        )
        monkeypatch.setattr(store, "get_task", real_get)
        return seen

    monkeypatch.setattr(store, "get_task", read_then_moved)
    app.invoke(stale_payload)

    assert _sent(app) == []
    back = real_get(first.id)
    assert back is not None and back.state is TaskState.PENDING
    assert (back.send_at, back.attempts, back.claimed_at) == (moved_to, 0, None)
    assert back.token != first.token
    # the new schedule (made by whoever moved it; here by hand) sends it once, on time
    app.writer.ensure(back)
    _fake(app).run_until(clock, app.invoke, moved_to)
    assert _sent(app) == [moved_to]
