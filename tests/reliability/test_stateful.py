"""The whole system as a state machine (hypothesis): real services over a real SQLite store and
the embedded scheduler, a fake clock and a recording mailer, with every failure mode mixed in.

Invariants, checked after every step:

- a Finished or Cancelled task never changes;
- under the ``fail`` stale policy no email is sent twice; under ``retry`` only an email whose
  worker died after the provider accepted it may arrive twice;
- after a reconcile every Pending task of an active campaign has exactly one schedule (its
  expected name), and no schedule is left for a final task;
- no send happens before its send time, and every planned send time lies inside the policy's
  windows;
- a send never leaves the policy: every email went out inside a window of an allowed day
  (the embedded layer fires exactly: no tolerance), and no local day of a campaign has more
  than ``per_day`` sends, whatever outages (the clock jumping while nothing fires), transient
  failures, dead workers, pauses and resumes came before (SENDQUEUE_MAX_LATENESS 300 s: the
  overdue ones are moved, not sent late);
- nothing is bunched: no two sends of a campaign come closer than half its planned spacing,
  unless both went out on time by their first plan (jitter may plan neighbours close);
- replaying the change log gives exactly the stored counts.

At the end: a final reconcile and drain, firing each schedule at its time, leave no task lost
under ``retry``.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import DomainError, StoreUnavailable, Throttled, TransientMailError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Task, expected_schedule_name, schedule_group
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy, nominal_spacing
from sendqueue.ports import OutgoingMessage
from sendqueue.services.scheduling.schedules import ScheduleWriter, send_payload
from sendqueue.services.sending.worker import FIRING_SLACK
from sendqueue.settings import Settings
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer

T0 = datetime(2026, 12, 1, 7, 30, tzinfo=UTC)  # Tuesday 08:30 in Berlin


class Crash(BaseException):
    """A worker process dying mid-send: not an Exception, so nothing in the code catches it."""


class FaultyStore:
    """The real store, whose next claims can be made to fail (an outage during a send)."""

    def __init__(self, inner: SqlTaskStore) -> None:
        self.inner = inner
        self.failing_claims = 0

    def transition(self, task_id: str, expected: TaskState, new: TaskState, **kw: Any) -> Any:
        if new is TaskState.RUNNING and self.failing_claims > 0:
            self.failing_claims -= 1
            raise StoreUnavailable("injected: the database is unreachable")
        return self.inner.transition(task_id, expected, new, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class ThrottlingScheduler:
    """The real embedded scheduler, whose next ``create`` calls can be throttled."""

    def __init__(self, inner: EmbeddedScheduler) -> None:
        self.inner = inner
        self.throttle = 0

    def create(self, *args: Any, **kwargs: Any) -> Any:
        if self.throttle > 0:
            self.throttle -= 1
            raise Throttled("injected: rate exceeded")
        return self.inner.create(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


POLICIES = [
    SendingPolicy(
        timezone="Europe/Berlin", per_day=4, windows=(Window(540, 720), Window(780, 1020))
    ),
    SendingPolicy(timezone="America/New_York", per_day=3, weekdays=frozenset({0, 2, 4})),
    SendingPolicy(
        timezone="UTC", per_day=50, weekdays=frozenset(range(7)), windows=(Window(0, 1440),)
    ),
]


class SendqueueMachine(RuleBasedStateMachine):
    stale_policy = "retry"
    campaigns = Bundle("campaigns")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sq-stateful-"))
        self.clock = FakeClock(T0)
        self.store = FaultyStore(open_store(f"sqlite:///{self.dir / 'store.db'}"))
        self.scheduler = ThrottlingScheduler(
            EmbeddedScheduler(
                f"sqlite:///{self.dir / 'scheduler.db'}",
                clock=self.clock,
                alarm=RecordingAlarm(),
                retry_backoff=5,
                lease_seconds=60,
                seed=1,
            )
        )
        self.mailer = RecordingMailer()
        self.app: Container = bootstrap(
            Settings(
                _env_file=None,
                stale_policy=self.stale_policy,
                stale_after=600,
                retry_backoff=60,
                auto_pause_after=0,
                max_attempts=3,
                max_lateness=300,
            ),
            clock=self.clock,
            store=self.store,
            scheduler=self.scheduler,
            mailer=self.mailer,
        )
        self.app.__dict__["writer"] = ScheduleWriter(
            self.scheduler,
            self.app.timezone_of,
            concurrency=1,
            sleep=lambda _s: None,
        )
        self.frozen: dict[str, Task] = {}
        self.accepted_then_died: set[str] = set()
        self.ids: list[str] = []

    def teardown(self) -> None:
        self.app.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------------
    def _tasks(self, cid: str) -> list[Task]:
        return self.store.inner.list_tasks(cid, limit=1000)

    def _all_tasks(self) -> list[Task]:
        return [t for cid in self.ids for t in self._tasks(cid)]

    def _fire(self) -> None:
        with contextlib.suppress(Crash):
            self.scheduler.inner.fire_due(self.app.invoke)

    # -- rules --------------------------------------------------------------------------
    @initialize(target=campaigns, size=st.integers(1, 6), policy=st.sampled_from(POLICIES))
    def first_campaign(self, size: int, policy: SendingPolicy) -> str:
        # create is a rule too: hypothesis types its result as a value or a MultipleResults
        return cast(str, self.create(size, policy))

    @rule(target=campaigns, size=st.integers(1, 6), policy=st.sampled_from(POLICIES))
    def create(self, size: int, policy: SendingPolicy) -> str:
        rows = "\n".join(f"p{len(self.ids)}-{i}@example.com,P {i},S {i},B {i}" for i in range(size))
        cid = self.app.campaign_import.create(
            name=f"c{len(self.ids)}",
            recipients=("email,name,subject,body\n" + rows + "\n").encode(),
            policy=policy,
        ).campaign.id
        self.ids.append(cid)
        return cid

    @rule(cid=campaigns)
    def provision(self, cid: str) -> None:
        with contextlib.suppress(DomainError):
            self.app.provisioner.provision(cid)

    @rule(seconds=st.sampled_from([1, 30, 600, 3600, 6 * 3600, 86400]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule()
    def fire_due(self) -> None:
        self._fire()

    @rule(data=st.data())
    def fire_duplicate_or_stale(self, data: st.DataObject) -> None:
        tasks = self._all_tasks()
        if not tasks:
            return
        task = data.draw(st.sampled_from(tasks))
        payload = send_payload(task)
        if data.draw(st.booleans()):
            payload = {**payload, "token": "an-old-token"}  # out of order: a stale schedule
        for _ in range(2):
            with contextlib.suppress(Crash, StoreUnavailable):
                self.app.invoke(payload)

    @rule(after_accept=st.booleans())
    def crash_next_send(self, after_accept: bool) -> None:
        """The next send's worker dies: after its claim, or after the provider accepted."""

        def die(message: OutgoingMessage) -> None:
            self.mailer.on_send = None
            self.mailer.after_send = None
            if after_accept:
                self.accepted_then_died.add(message.headers["X-Sendqueue-Task"])
            raise Crash

        if after_accept:
            self.mailer.after_send = die
        else:
            self.mailer.on_send = die
        self._fire()
        self.mailer.on_send = None
        self.mailer.after_send = None

    @rule(data=st.data())
    def lose_schedule(self, data: st.DataObject) -> None:
        pending = [t for t in self._all_tasks() if t.state is TaskState.PENDING]
        if pending:
            task = data.draw(st.sampled_from(pending))
            self.scheduler.inner.delete(expected_schedule_name(task))

    @rule(n=st.integers(1, 3))
    def transient_failures(self, n: int) -> None:
        """The provider refuses the next sends for now (421): they retry in a free slot."""
        self.mailer.fail_next(*[TransientMailError("421 4.7.0 try again later")] * n)
        self._fire()
        self.mailer.fail_next()

    @rule()
    def run_to_next_send(self) -> None:
        """A worker that is up: the clock moves to the next planned send, which fires."""
        pending = [t.send_at for t in self._all_tasks() if t.state is TaskState.PENDING]
        if pending:
            self.clock.set(max(self.clock.now(), min(pending)))
            self._fire()

    @rule(n=st.integers(1, 3))
    def fail_store_writes(self, n: int) -> None:
        self.store.failing_claims = n
        self._fire()

    @rule(n=st.integers(1, 5))
    def throttle_scheduler(self, n: int) -> None:
        self.scheduler.throttle = n

    @rule(cid=campaigns, action=st.sampled_from(["cancel", "pause", "resume", "retry_failed"]))
    def control(self, cid: str, action: str) -> None:
        with contextlib.suppress(DomainError):
            getattr(self.app.campaign_controls, action)(cid)

    @rule(data=st.data())
    def cancel_one(self, data: st.DataObject) -> None:
        tasks = self._all_tasks()
        if tasks:
            with contextlib.suppress(DomainError):
                self.app.campaign_controls.cancel_task(data.draw(st.sampled_from(tasks)).id)

    @rule()
    def redrive_dead_letters(self) -> None:
        for letter in self.scheduler.inner.dead_letters():
            self.scheduler.inner.redrive(letter.id)

    @rule()
    def reconcile(self) -> None:
        self.scheduler.throttle = 0
        self.app.reconciler.run()
        self.check_schedules_match_tasks()

    # -- invariants ---------------------------------------------------------------------
    def check_schedules_match_tasks(self) -> None:
        for cid in self.ids:
            campaign = self.store.inner.get_campaign(cid)
            schedules = self.scheduler.inner.list(schedule_group(cid), limit=1000)
            names = Counter(s.name for s in schedules)
            tasks = {t.id: t for t in self._tasks(cid)}
            # a Running task's schedule is the one in flight (named for its previous attempt)
            in_flight = {
                s.name
                for s in schedules
                if (t := tasks.get(s.payload.get("task_id", ""))) and t.state is TaskState.RUNNING
            }
            if campaign.state is CampaignState.ACTIVE:
                expected = Counter(
                    expected_schedule_name(t)
                    for t in tasks.values()
                    if t.state is TaskState.PENDING
                )
                extra = set(names) - set(expected) - in_flight
                assert not extra, f"orphan schedules left: {extra}"
                assert {n: c for n, c in names.items() if n in expected} == expected
            for s in schedules:
                task = tasks.get(s.payload.get("task_id", ""))
                assert task is None or not task.state.is_final, (
                    f"final task {task.id} still has schedule {s.name}"
                )

    @invariant()
    def final_tasks_never_change(self) -> None:
        for task in self._all_tasks():
            before = self.frozen.get(task.id)
            if before is not None:
                assert (task.state, task.sent_at, task.message_id) == (
                    before.state,
                    before.sent_at,
                    before.message_id,
                ), f"final task {task.id} changed"
            elif task.state in {TaskState.FINISHED, TaskState.CANCELLED}:
                self.frozen[task.id] = task

    @invariant()
    def no_duplicate_sends_beyond_the_policy(self) -> None:
        sent = Counter(m.headers["X-Sendqueue-Task"] for m in self.mailer.sent)
        twice = {tid for tid, n in sent.items() if n > 1}
        if self.stale_policy == "fail":
            assert not twice, f"sent twice under the fail policy: {twice}"
        else:
            assert twice <= self.accepted_then_died, f"unexplained duplicates: {twice}"

    @invariant()
    def sends_never_early_and_plans_inside_windows(self) -> None:
        policies = {cid: self.store.inner.get_campaign(cid).policy for cid in self.ids}
        for task in self._all_tasks():
            policy = policies[task.campaign_id]
            local = task.send_at.astimezone(policy.zone)
            minute = local.hour * 60 + local.minute + local.second / 60
            assert local.weekday() in policy.weekdays
            assert any(w.start_minute <= minute < w.end_minute for w in policy.windows), (
                f"{task.id} planned outside the windows at {local}"
            )
            if task.sent_at is not None:
                assert task.sent_at >= task.send_at, f"{task.id} sent before its time"

    @invariant()
    def sends_keep_the_policy_and_the_daily_cap(self) -> None:
        policies = {cid: self.store.inner.get_campaign(cid).policy for cid in self.ids}
        per_day: Counter[tuple[str, object]] = Counter()
        seen: set[str] = set()
        for message in self.mailer.sent:
            tid = message.headers["X-Sendqueue-Task"]
            cid = tid.rsplit("-", 1)[0]
            policy = policies[cid]
            assert in_policy(policy, message.date), (
                f"{tid} sent outside the policy at {message.date.astimezone(policy.zone)}"
            )
            if tid in seen:  # a resend of an email whose worker died after the provider
                continue  # accepted it (at-least-once, under retry): one email, one count
            seen.add(tid)
            per_day[cid, message.date.astimezone(policy.zone).date()] += 1
        for (cid, day), n in per_day.items():
            assert n <= policies[cid].per_day, f"{cid} sent {n} on {day}"

    @invariant()
    def no_burst_but_planned_neighbours(self) -> None:
        tasks = {t.id: t for t in self._all_tasks()}
        firsts: dict[str, datetime] = {}
        for message in self.mailer.sent:  # a resend (at-least-once) is the same email
            firsts.setdefault(message.headers["X-Sendqueue-Task"], message.date)
        by_campaign: dict[str, list[tuple[datetime, str]]] = {}
        for tid, at in firsts.items():
            by_campaign.setdefault(tid.rsplit("-", 1)[0], []).append((at, tid))

        def on_time(tid: str, at: datetime) -> bool:
            planned = tasks[tid].planned_at or tasks[tid].send_at
            return at - planned <= FIRING_SLACK

        for cid, sends in by_campaign.items():
            gap = nominal_spacing(self.store.inner.get_campaign(cid).policy) / 2
            for (a, ta), (b, tb) in itertools.pairwise(sorted(sends)):
                assert b - a >= gap or (on_time(ta, a) and on_time(tb, b)), (
                    f"{ta} at {a} and {tb} at {b}: closer than {gap} and not both on time"
                )

    @invariant()
    def change_log_replays_to_the_stored_counts(self) -> None:
        for cid in self.ids:
            states: dict[str, str] = {}
            for entry in self.store.inner.changes_after(0, campaign_id=cid, limit=100_000):
                if entry.task_id is not None:
                    assert states.get(entry.task_id) == entry.from_state, "log out of step"
                    states[entry.task_id] = entry.to_state
            replayed = Counter(states.values())
            stored = self.store.inner.count_tasks(cid)
            assert {s.value: replayed.get(s.value, 0) for s in TaskState} == {
                s.value: n for s, n in stored.items()
            }

    def drain(self) -> None:
        """The end of the story: outages over, everything reconciled and sent."""
        self.store.failing_claims = 0
        self.scheduler.throttle = 0
        self.redrive_dead_letters()
        for cid in self.ids:
            campaign = self.store.inner.get_campaign(cid)
            if campaign.state is CampaignState.PAUSED:
                self.app.campaign_controls.resume(cid)
            elif campaign.state is CampaignState.DRAFT:
                self.app.provisioner.provision(cid)
        # A worker that stays up from now on: each schedule fires at its time (a due one held
        # back by the layer's retry back-off, or a Running one gone stale, waits a little).
        for _ in range(600):
            self.app.reconciler.run()
            tasks = self._all_tasks()
            pending = [t.send_at for t in tasks if t.state is TaskState.PENDING]
            if not pending and not any(t.state is TaskState.RUNNING for t in tasks):
                break
            due = min(pending) if pending else self.clock.now() + timedelta(seconds=601)
            if due <= self.clock.now():
                due = self.clock.now() + timedelta(seconds=60)
            self.clock.set(due)
            self._fire()


class RetryPolicyMachine(SendqueueMachine):
    stale_policy = "retry"

    def teardown(self) -> None:
        try:
            self.drain()
            sent = {m.headers["X-Sendqueue-Task"] for m in self.mailer.sent}
            for task in self._all_tasks():
                assert task.state.is_final, f"{task.id} never finished"
                if task.state is TaskState.FINISHED:
                    assert task.id in sent
                # no email lost: anything not cancelled or refused went out
                assert task.state is not TaskState.FAILED or task.error, task
        finally:
            super().teardown()


class FailPolicyMachine(SendqueueMachine):
    stale_policy = "fail"


SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # No shrinking: over real SQLite files it takes many minutes, and the failing sequence is
    # printed step by step anyway.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
TestRetryPolicy = RetryPolicyMachine.TestCase
TestRetryPolicy.settings = SETTINGS
TestFailPolicy = FailPolicyMachine.TestCase
TestFailPolicy.settings = SETTINGS
