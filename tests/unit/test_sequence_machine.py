"""Sequences as a state machine (hypothesis): the real services on fakes and a fake clock, one
campaign of 1 to 4 steps, driven through time, outages, SMTP failures, answers, reconciler
passes and pause / resume / cancel.

Each run draws the campaign: its steps' delays (sending days, hours, minutes), its policy
(weekdays, windows, skip dates, per_day; UTC, Europe/Berlin or America/New_York, starting
around a DST change or not), local time with recipients in their own zones or not, and no,
one or two senders with their caps and gaps. Checked after every rule:

- no step k goes out before step k-1's send plus its delay
  (:func:`~sendqueue.domain.followups.follow_up_earliest`);
- nothing goes to a recipient once an answer (reply, hard bounce, complaint, unsubscribe) to
  any of its steps was applied, through the feedback service or written as a bare outcome
  (an answer racing the making of the next step, which then stops it);
- each (recipient, step) goes out at most once (``X-Sendqueue-Task``);
- every send lies inside the policy's windows and days (the recipient's zone in local time),
  no local day has more than ``per_day`` sends, no sender more than its cap on its day nor two
  sends closer than its gap, all steps counted together;
- a completed campaign has no recipient whose sequence goes on (not even one whose next step a
  failed send kept from being made).

At the end, time drains (reconcile, fire each schedule at its time, repeatedly) and every
recipient's sequence must have ended: every step Finished, or stopped (a Cancelled or Failed
step, an answer), or the campaign cancelled.

Budget: 100 examples of up to 40 rules each (``SETTINGS``): about 10 s, under 30 s when busy.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from datetime import UTC, date, datetime, timedelta

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import DomainError, PermanentMailError, TransientMailError
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.ports import OutgoingMessage
from sendqueue.services.planning.capacity import policy_for
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import fake_app

#: Starts: an ordinary Tuesday, and the days before DST changes in Berlin and New York.
STARTS = [
    datetime(2026, 12, 1, 7, 30, tzinfo=UTC),
    datetime(2027, 3, 26, 20, 0, tzinfo=UTC),  # Friday; Berlin springs forward on Sunday
    datetime(2027, 3, 12, 12, 0, tzinfo=UTC),  # Friday; New York springs forward on Sunday
    datetime(2026, 10, 23, 15, 0, tzinfo=UTC),  # Friday; Berlin falls back on Sunday
    datetime(2026, 10, 30, 20, 0, tzinfo=UTC),  # Friday; New York falls back on Sunday
]
ZONES = ["UTC", "Europe/Berlin", "America/New_York"]
RECIPIENT_ZONES = ["", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC"]
WINDOWS = [
    (Window(0, 1440),),
    (Window(540, 1020),),
    (Window(540, 720), Window(780, 1020)),
    (Window(90, 210), Window(1320, 1440)),  # 01:30-03:30 holds the DST change
]
DELAYS = ["1d", "2d", "3d", "1h", "4h", "30m", "90m"]
ANSWERS = [
    FeedbackKind.REPLY,
    FeedbackKind.HARD_BOUNCE,
    FeedbackKind.COMPLAINT,
    FeedbackKind.UNSUBSCRIBE,
]
RACING = [TaskOutcome.REPLIED, TaskOutcome.BOUNCED, TaskOutcome.UNSUBSCRIBED]

policies = st.builds(
    lambda zone, days, windows, skips, per_day: (zone, days, windows, skips, per_day),
    st.sampled_from(ZONES),
    st.frozensets(st.integers(0, 6), min_size=1),
    st.sampled_from(WINDOWS),
    st.frozensets(st.integers(0, 9), max_size=3),
    st.sampled_from([1, 2, 3, 50]),
)
senders = st.lists(
    st.tuples(st.integers(1, 4), st.sampled_from([60, 900, 3600]), st.sampled_from(ZONES)),
    max_size=2,
)


class SequenceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(STARTS[0])
        self.mailer = RecordingMailer()
        self.scheduler = FakeScheduler(self.clock, seed=1)
        self.app: Container = fake_app(
            clock=self.clock,
            scheduler=self.scheduler,
            mailer=self.mailer,
            max_lateness=300,
            space_late_sends=True,
            max_attempts=3,
            auto_pause_after=0,
        )
        self.cid = ""
        self.count = 0
        # position -> how many emails it had been sent when an answer to it was applied
        self.answered: dict[int, int] = {}

    # -- setup ----------------------------------------------------------------------------
    @initialize(
        start=st.sampled_from(STARTS),
        delays=st.lists(st.sampled_from(DELAYS), max_size=3),
        drawn=policies,
        local_time=st.booleans(),
        zones=st.lists(st.sampled_from(RECIPIENT_ZONES), min_size=1, max_size=5),
        sender_specs=senders,
    )
    def create(
        self,
        start: datetime,
        delays: list[str],
        drawn: tuple[str, frozenset[int], tuple[Window, ...], frozenset[int], int],
        local_time: bool,
        zones: list[str],
        sender_specs: list[tuple[int, int, str]],
    ) -> None:
        zone, days, windows, skips, per_day = drawn
        self.clock.set(start)
        policy = SendingPolicy(
            timezone=zone,
            per_day=per_day,
            weekdays=days,
            windows=windows,
            skip_dates=frozenset(start.date() + timedelta(days=n) for n in skips),
            start=start,
        )
        steps = [Step(1, "Hello {{ name }}", "Hi {{ name }}\n", None, None)]
        steps += [
            Step(k, None, f"Step {k}\n", None, parse_delay(d)) for k, d in enumerate(delays, 2)
        ]
        ids = [
            self.app.senders.add(
                email=f"s{n}@example.com", daily_cap=cap, min_gap_seconds=gap, timezone=tz
            ).id
            for n, (cap, gap, tz) in enumerate(sender_specs)
        ]
        rows = "".join(f"r{i}@example.com,R{i},{z}\n" for i, z in enumerate(zones))
        self.count = len(zones)
        with contextlib.suppress(DomainError):  # e.g. a policy that never sends is refused
            created = self.app.campaign_import.create(
                name="seq",
                recipients=("email,name,timezone\n" + rows).encode(),
                policy=policy,
                from_addr="n@example.com",
                steps=steps,
                senders=ids,
                local_time=local_time,
            )
            self.cid = created.campaign.id
            self.app.provisioner.provision(self.cid)

    # -- helpers --------------------------------------------------------------------------
    def _campaign(self) -> Campaign:
        return self.app.store.get_campaign(self.cid)

    def _tasks(self) -> list[Task]:
        return self.app.store.list_tasks(self.cid, limit=1000) if self.cid else []

    def _fire(self) -> None:
        self.scheduler.fire_due(self.app.invoke)

    def _messages(self) -> list[tuple[Task, OutgoingMessage]]:
        """Every accepted email with its task as stored now."""
        sent = self.mailer.sent
        found = self.app.store.get_tasks([m.headers["X-Sendqueue-Task"] for m in sent])
        return [(found[m.headers["X-Sendqueue-Task"]], m) for m in sent]

    # -- rules ----------------------------------------------------------------------------
    @precondition(lambda self: bool(self.cid))
    @rule(minutes=st.sampled_from([1, 10, 60, 240, 1440, 3 * 1440]))
    def worker_up(self, minutes: int) -> None:
        """The worker is up: each schedule fires at its time for a while."""
        self.scheduler.run_until(
            self.clock, self.app.invoke, self.clock.now() + timedelta(minutes=minutes)
        )

    @precondition(lambda self: bool(self.cid))
    @rule()
    def next_send(self) -> None:
        """The worker is up until the next planned send (and those due with it) went out."""
        pending = [t.send_at for t in self._tasks() if t.state is TaskState.PENDING]
        if pending:
            until = max(self.clock.now(), min(pending))
            self.scheduler.run_until(self.clock, self.app.invoke, until)

    @precondition(lambda self: bool(self.cid))
    @rule(minutes=st.sampled_from([3, 30, 300, 1440, 2 * 1440]))
    def outage(self, minutes: int) -> None:
        """The worker is down for a while, then fires what is due: late sends catch up."""
        self.clock.advance(minutes=minutes)
        self._fire()

    @precondition(lambda self: bool(self.cid))
    @rule(n=st.integers(1, 2), permanent=st.booleans())
    def smtp_refuses(self, n: int, permanent: bool) -> None:
        """The next sends are refused (a 421 retries in a free slot; a 550 fails the step)."""
        error = PermanentMailError("550 5.1.1 no such user") if permanent else None
        self.mailer.fail_next(*[error or TransientMailError("421 4.7.0 try later")] * n)
        pending = [t.send_at for t in self._tasks() if t.state is TaskState.PENDING]
        if pending:
            self.scheduler.run_until(self.clock, self.app.invoke, max(self.clock.now(), *pending))

    @precondition(lambda self: bool(self.cid))
    @rule(data=st.data(), kind=st.sampled_from(ANSWERS))
    def answer(self, data: st.DataObject, kind: FeedbackKind) -> None:
        """A recipient answers one of the emails it was sent."""
        messages = self._messages()
        if not messages:
            return
        task, _ = data.draw(st.sampled_from(messages))
        before = sum(1 for t, _ in messages if t.position == task.position)
        self.app.feedback.apply(Feedback(kind, self.clock.now(), task_id=task.id, detail="x"))
        self.answered.setdefault(task.position, before)

    @precondition(lambda self: bool(self.cid))
    @rule(data=st.data(), outcome=st.sampled_from(RACING))
    def answer_racing_the_next_step(self, data: st.DataObject, outcome: TaskOutcome) -> None:
        """An answer recorded while its recipient's next step is being made: the outcome is
        written, the feedback loop's cancel of Pending emails comes too late to see it."""
        messages = self._messages()
        if not messages:
            return
        task, _ = data.draw(st.sampled_from(messages))
        before = sum(1 for t, _ in messages if t.position == task.position)
        self.app.store.set_outcome(task.id, outcome, detail="x", at=self.clock.now())
        self.answered.setdefault(task.position, before)

    @precondition(lambda self: bool(self.cid))
    @rule()
    def next_step_lost(self) -> None:
        """The worker crashes between a send and making the next step: the reconciler makes it."""
        followups = self.app.followups

        def crash(*args: object, **kwargs: object) -> int:
            raise RuntimeError("the worker died")

        followups.make_due = crash  # type: ignore[method-assign]
        try:
            pending = [t.send_at for t in self._tasks() if t.state is TaskState.PENDING]
            if pending:  # the next send (or those due with it)
                until = max(self.clock.now(), min(pending))
                self.scheduler.run_until(self.clock, self.app.invoke, until)
        finally:
            del followups.make_due

    @precondition(lambda self: bool(self.cid))
    @rule()
    def reconcile(self) -> None:
        self.app.reconciler.run()

    @precondition(lambda self: bool(self.cid))
    @rule(action=st.sampled_from(["pause", "resume", "resume", "cancel"]))
    def control(self, action: str) -> None:
        with contextlib.suppress(DomainError):
            getattr(self.app.campaign_controls, action)(self.cid)

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def each_step_once_after_its_delay(self) -> None:
        if not self.cid:
            return
        campaign = self._campaign()
        sent = Counter(m.headers["X-Sendqueue-Task"] for m in self.mailer.sent)
        assert not {t for t, n in sent.items() if n > 1}, f"sent twice: {sent}"
        for task, message in self._messages():
            if task.step == 1:
                continue
            before = self.app.store.get_task(task_id(self.cid, task.position, task.step - 1))
            assert before is not None and before.sent_at is not None, f"{task.id}: no step before"
            zone = task.timezone if campaign.local_time else None
            delay = campaign.steps[task.step - 1].after
            assert delay is not None
            earliest = follow_up_earliest(campaign.policy, before.sent_at, delay, zone)
            assert message.date >= earliest, (
                f"{task.id} sent at {message.date}, before {earliest} "
                f"(step {task.step - 1} sent at {before.sent_at}, then {delay.text})"
            )

    @invariant()
    def nothing_after_an_answer(self) -> None:
        if not self.cid:
            return
        per_position = Counter(t.position for t, _ in self._messages())
        for position, count in self.answered.items():
            assert per_position[position] == count, (
                f"recipient {position} was sent {per_position[position] - count} after answering"
            )

    @invariant()
    def sends_keep_the_policy_and_the_caps(self) -> None:
        if not self.cid:
            return
        campaign = self._campaign()
        per_day: Counter[date] = Counter()
        by_sender: dict[str, list[datetime]] = {}
        for task, message in self._messages():
            policy = policy_for(campaign, task.timezone)
            assert in_policy(policy, message.date), (
                f"{task.id} sent outside the policy at {message.date.astimezone(policy.zone)}"
            )
            per_day[message.date.astimezone(campaign.policy.zone).date()] += 1
            if task.sender_id is not None:
                by_sender.setdefault(task.sender_id, []).append(message.date)
        for day, n in per_day.items():
            assert n <= campaign.policy.per_day, f"{n} sends on {day}"
        for sender_id, sends in by_sender.items():
            sender = self.app.senders.get(sender_id)
            days = Counter(at.astimezone(sender.zone).date() for at in sends)
            assert max(days.values()) <= sender.daily_cap, f"{sender.email}: {days}"
            ordered = sorted(sends)
            for a, b in itertools.pairwise(ordered):
                assert (b - a).total_seconds() >= sender.min_gap_seconds, (
                    f"{sender.email} sent at {a} and {b}: closer than {sender.min_gap_seconds} s"
                )

    @invariant()
    def completed_means_every_sequence_ended(self) -> None:
        if self.cid and self._campaign().state is CampaignState.COMPLETED:
            self._check_all_ended()

    # -- the end --------------------------------------------------------------------------
    def _ongoing(self) -> list[str]:
        """The recipients whose sequence has not ended, each with why."""
        campaign = self._campaign()
        if campaign.state is CampaignState.CANCELLED:
            return []
        last = len(campaign.steps)
        by_position: dict[int, dict[int, Task]] = {}
        for task in self._tasks():
            by_position.setdefault(task.position, {})[task.step] = task
        ongoing = []
        for position in range(self.count):
            steps = by_position.get(position, {})
            ended = False
            for k in range(1, last + 1):
                step = steps.get(k)
                if step is None or step.state in (TaskState.PENDING, TaskState.RUNNING):
                    break
                answered = step.outcome is not None and step.outcome is not TaskOutcome.ACCEPTED
                if step.state is not TaskState.FINISHED or answered or k == last:
                    ended = True
                    break
            if not ended:
                states = sorted((k, t.state.value) for k, t in steps.items())
                ongoing.append(f"{position}: {states}")
        return ongoing

    def _check_all_ended(self) -> None:
        ongoing = self._ongoing()
        assert not ongoing, f"sequences not ended in a {self._campaign().state} campaign: {ongoing}"

    def teardown(self) -> None:
        try:
            if self.cid:
                self.drain()
                self._check_all_ended()
                self.each_step_once_after_its_delay()
                self.nothing_after_an_answer()
                self.sends_keep_the_policy_and_the_caps()
        finally:
            self.app.close()

    def drain(self) -> None:
        """A worker that stays up from now on, and a reconciler that runs now and then."""
        self.mailer.fail_next()  # queued refusals may still be left: they are spent below
        with contextlib.suppress(DomainError):
            self.app.campaign_controls.resume(self.cid)
        for _ in range(400):
            self.app.reconciler.run()
            tasks = self._tasks()
            marked = self.app.store.follow_ups_due(self.cid, limit=1)  # a dead send's marks
            if not marked and not any(
                t.state in (TaskState.PENDING, TaskState.RUNNING) for t in tasks
            ):
                break
            due = self.scheduler.next_due()
            until = self.clock.now() + timedelta(hours=1)
            if due is not None:
                until = max(due, self.clock.now() + timedelta(seconds=1))
            self.scheduler.run_until(self.clock, self.app.invoke, until)


SETTINGS = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
TestSequenceMachine = SequenceMachine.TestCase
TestSequenceMachine.settings = SETTINGS
