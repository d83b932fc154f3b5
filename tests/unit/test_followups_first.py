"""Follow-ups first, the pure rule: which first step gives its slot, and a day-grid model of a
campaign in which every follow-up goes out within a sending day and no day holds more than
per_day."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.followups_first import first_step_to_displace, on_time_until
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, pending_task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy
from sendqueue.domain.steps import parse_delay

T0 = datetime(2026, 12, 1, tzinfo=UTC)  # a Tuesday
#: Every day, all day, in UTC: every instant is inside it.
OPEN = SendingPolicy(timezone="UTC", weekdays=frozenset(range(7)), windows=(Window(0, 1440),))
#: Mon-Fri, 09:00-17:00 UTC.
WEEKDAYS = SendingPolicy(
    timezone="UTC", per_day=20, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
)


def _task(
    position: int,
    at: datetime,
    *,
    step: int = 1,
    campaign: str = "c",
    sender: str | None = None,
    zone: str | None = None,
    state: TaskState = TaskState.PENDING,
) -> Task:
    task = pending_task(
        task_id(campaign, position, step), campaign, position, f"u{position}@example.com", "",
        "s", "t", None, at, "tok", T0, sender, None, zone, step,
    )  # fmt: skip
    return task if state is TaskState.PENDING else replace(task, state=state)


def test_on_time_ends_at_the_start_of_the_second_sending_day() -> None:
    friday = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    # Friday's slots and Monday's are on time; Tuesday's first window is not
    assert on_time_until(WEEKDAYS, friday) == datetime(2026, 12, 8, 9, 0, tzinfo=UTC)
    assert on_time_until(WEEKDAYS, friday, "Asia/Tokyo") == datetime(
        2026, 12, 8, 0, 0, tzinfo=UTC
    )  # 09:00 in Tokyo


def test_the_newest_first_step_on_the_earliest_day_is_taken() -> None:
    follow = _task(1, T0, step=2, sender="s1")
    day1, day2 = T0 + timedelta(hours=10), T0 + timedelta(days=1, hours=10)
    candidates = [
        _task(50, day1, sender="s1"),
        _task(52, day1 + timedelta(minutes=30), sender="s1"),
        _task(90, day2, sender="s1"),  # newer, but a day later
        _task(60, day1, sender="s2"),  # another sender's slot: its cap would change
        _task(70, day1, step=2, sender="s1"),  # a follow-up is never displaced
        _task(80, day1, campaign="d", sender="s1"),  # another campaign's
        _task(81, day1, sender="s1", state=TaskState.RUNNING),
    ]
    until = T0 + timedelta(days=2)
    found = first_step_to_displace(follow, candidates, earliest=T0, until=until, policy=OPEN)
    assert found is not None and found.position == 52
    later = first_step_to_displace(follow, candidates[2:], earliest=T0, until=until, policy=OPEN)
    assert later is candidates[2]
    # nothing before ``until``
    assert first_step_to_displace(follow, candidates, earliest=T0, until=day1, policy=OPEN) is None


def test_only_a_slot_inside_the_follow_ups_own_windows_is_taken() -> None:
    # a local-time campaign: the follow-up's recipient is in Berlin (09:00-17:00 there)
    berlin = replace(WEEKDAYS, timezone="Europe/Berlin")
    follow = _task(1, T0, step=2, zone="Europe/Berlin")
    tokyo_morning = _task(9, T0 + timedelta(hours=1), zone="Asia/Tokyo")  # 02:00 in Berlin
    new_york_morning = _task(8, T0 + timedelta(hours=15), zone="America/New_York")  # 16:00
    kw = {"earliest": T0, "until": T0 + timedelta(days=2), "policy": berlin}
    assert first_step_to_displace(follow, [tokyo_morning], **kw) is None  # type: ignore[arg-type]
    found = first_step_to_displace(follow, [tokyo_morning, new_york_morning], **kw)  # type: ignore[arg-type]
    assert found is new_york_morning


_TASKS = st.builds(
    _task,
    position=st.integers(0, 400),
    at=st.integers(0, 4 * 24 * 60).map(lambda m: T0 + timedelta(minutes=m)),
    step=st.integers(1, 3),
    campaign=st.sampled_from(["c", "d"]),
    sender=st.sampled_from([None, "s1", "s2"]),
    zone=st.sampled_from([None, "Europe/Berlin"]),
    state=st.sampled_from([TaskState.PENDING, TaskState.PENDING, TaskState.RUNNING]),
)


@settings(max_examples=300, deadline=None)
@given(
    candidates=st.lists(_TASKS, max_size=40),
    sender=st.sampled_from([None, "s1", "s2"]),
    windowed=st.booleans(),
    start=st.integers(0, 2 * 24 * 60),
    span=st.integers(0, 3 * 24 * 60),
)
def test_the_task_taken_is_eligible_and_first_by_day_then_newest(
    candidates: list[Task], sender: str | None, windowed: bool, start: int, span: int
) -> None:
    policy = WEEKDAYS if windowed else OPEN
    follow = _task(999, T0, step=2, sender=sender, zone="Europe/Berlin")
    earliest = T0 + timedelta(minutes=start)
    until = earliest + timedelta(minutes=span)

    def eligible(t: Task) -> bool:
        return (
            t.step == 1
            and t.state is TaskState.PENDING
            and t.campaign_id == "c"
            and earliest <= t.send_at < until
            and t.sender_id == sender
            and in_policy(policy, t.send_at)
        )

    found = first_step_to_displace(
        follow, candidates, earliest=earliest, until=until, policy=policy
    )
    ok = [t for t in candidates if eligible(t)]
    if not ok:
        assert found is None
        return
    assert found is not None and eligible(found)
    # swapping changes no count: same sender, same instant, so the same day and gaps
    first_day = min(t.send_at.date() for t in ok)
    assert found.send_at.date() == first_day
    assert found.position == max(t.position for t in ok if t.send_at.date() == first_day)


def _simulate(recipients: int, per_day: int, delay_days: int) -> None:
    """A campaign of 2-step sequences on a grid of ``per_day`` slots a sending day, run day by
    day with the rule; asserts every follow-up is on time and no day is over ``per_day``."""
    policy = replace(WEEKDAYS, per_day=per_day)
    delay = parse_delay(f"{delay_days}d")
    span = 2 * (2 * recipients // per_day) + delay_days + 14  # calendar days: room for all
    days = [
        T0 + timedelta(days=n, hours=9)
        for n in range(span)
        if (T0 + timedelta(days=n)).weekday() < 5
    ]
    grid = [day + timedelta(minutes=480 * i // per_day) for day in days for i in range(per_day)]
    held: dict[datetime, Task] = {}
    for position in range(recipients):
        held[grid[position]] = _task(position, grid[position])

    def first_free(after: datetime) -> datetime:
        start = bisect_left(grid, after)
        return next(slot for slot in grid[start:] if slot not in held)

    sent = 0
    for slot in grid:
        task = held.get(slot)
        if task is None:
            continue
        sent += 1
        if task.step == 2:
            continue
        earliest = follow_up_earliest(policy, slot, delay)
        until = on_time_until(policy, earliest)
        draft = _task(task.position, earliest, step=2)
        chosen = first_free(earliest)
        if chosen >= until:
            victim = first_step_to_displace(
                draft, [t for t in held.values() if t.send_at > slot],
                earliest=earliest, until=until, policy=policy,
            )  # fmt: skip
            if victim is not None:
                chosen = victim.send_at
                moved = first_free(chosen)
                held[moved] = replace(victim, send_at=moved)
        assert earliest <= chosen < until, (task.position, earliest, chosen)
        held[chosen] = replace(draft, send_at=chosen)
    assert sent == 2 * recipients  # one slot holds one send: no day is over per_day


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    recipients=st.integers(1, 300),
    per_day=st.integers(1, 30),
    delay_days=st.integers(1, 5),
)
def test_in_a_grid_model_every_follow_up_is_on_time(
    recipients: int, per_day: int, delay_days: int
) -> None:
    _simulate(recipients, per_day, delay_days)


def test_a_300_recipient_campaign_at_20_a_day_keeps_every_follow_up_on_time() -> None:
    _simulate(300, 20, 3)
