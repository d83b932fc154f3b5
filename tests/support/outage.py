"""Outage scenarios on real worker processes (issue 12): a campaign with two one-minute windows
a minute apart, workers that die or start late, and the checks of what the promise
"each email at its planned moment, inside the windows, never more than N a day" means after.

:func:`two_windows` lays the day out from the next whole minute ``T`` (at least ``lead``
seconds away, so the campaign is provisioned before its first slot): window A is
``[T, T+1 min)``, window B ``[T+2 min, T+3 min)``, every day, ``per_day`` sends spread over the
two minutes (12 a day: one every 10 s). :func:`check_outage` asserts the invariants from the
store, the execution layer and the SMTP arrival times, and returns the :class:`Figures` the
issue's note quotes.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, expected_schedule_name, schedule_group
from sendqueue.domain.policy import SendingPolicy, Window
from tests.support.smtp import ReceivedMail, SmtpSink

__all__ = [
    "ARRIVAL_SLACK",
    "EARLY_SLACK",
    "LATENCY_ALLOWANCE",
    "Figures",
    "TwoWindows",
    "WorkerProcess",
    "check_outage",
    "sleep_until",
    "two_windows",
    "worker_env",
]

ROOT = Path(__file__).resolve().parents[2]

#: How long after a window's end an SMTP arrival may still come: the send was claimed inside
#: the window and the dispatch, the SMTP dialogue and a loaded 2-core machine add the rest.
#: Both layers fire exactly (precision 0); this is latency, not precision.
ARRIVAL_SLACK = 2.0
#: How early an arrival may come: the worker's own EARLY_TOLERANCE (clock skew between hosts).
EARLY_SLACK = 1.0
#: What dispatch and SMTP latency may take off the gap between two arrivals. The planned
#: instants are checked exactly against half the spacing; the bug this guards against put six
#: arrivals within 30 ms.
LATENCY_ALLOWANCE = 1.5


@dataclass(frozen=True)
class TwoWindows:
    """The campaign's day: two one-minute windows (A at ``start``, B two minutes later)."""

    start: datetime
    """The UTC instant window A opens on the test's day (``T``)."""
    policy: SendingPolicy

    @property
    def zone(self) -> ZoneInfo:
        return self.policy.zone

    @property
    def spacing(self) -> float:
        """Seconds between two planned sends of the campaign's grid."""
        return self.policy.window_minutes * 60 / self.policy.per_day

    def window(self, name: str, day: int = 0) -> tuple[datetime, datetime]:
        """``[open, close)`` of window ``A`` or ``B`` on the test's day plus ``day`` days (a
        fixed-offset zone, so days are 24 h apart)."""
        offset = {"A": 0, "B": 120}[name]
        opens = self.start + timedelta(days=day, seconds=offset)
        return opens, opens + timedelta(seconds=60)

    def windows_around(self, at: datetime) -> list[tuple[datetime, datetime]]:
        """The windows of the day ``at`` falls on and of the days either side."""
        day = (at - self.start) // timedelta(days=1)
        return [self.window(n, d) for d in (day - 1, day, day + 1) for n in ("A", "B")]

    def inside(self, at: datetime, *, before: float = 0.0, after: float = 0.0) -> bool:
        """Whether ``at`` lies in a window, widened by ``before`` and ``after`` seconds."""
        return any(
            o - timedelta(seconds=before) <= at < c + timedelta(seconds=after)
            for o, c in self.windows_around(at)
        )

    def in_window(self, at: datetime, name: str, day: int = 0) -> bool:
        opens, closes = self.window(name, day)
        return opens <= at < closes

    def local_day(self, at: datetime) -> date:
        return at.astimezone(self.zone).date()


def two_windows(now: datetime, *, per_day: int = 12, lead: float = 20.0) -> TwoWindows:
    """The test's windows from the next whole minute at least ``lead`` seconds after ``now``.

    The zone is UTC, or a fixed UTC-1 (Etc/GMT+1) when the windows would cross UTC midnight,
    so every window lies within one local day and days are exactly 24 h apart.
    """
    start = now.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    if (start - now).total_seconds() < lead:
        start += timedelta(minutes=1)
    zone_name = "UTC"
    local = start.astimezone(ZoneInfo(zone_name))
    if local.hour * 60 + local.minute + 3 > 1440 - 1:
        zone_name = "Etc/GMT+1"
        local = start.astimezone(ZoneInfo(zone_name))
    minute = local.hour * 60 + local.minute
    policy = SendingPolicy(
        timezone=zone_name,
        per_day=per_day,
        weekdays=frozenset(range(7)),
        windows=(Window(minute, minute + 1), Window(minute + 2, minute + 3)),
        start=now,
    )
    return TwoWindows(start=start, policy=policy)


def sleep_until(at: datetime) -> None:
    left = (at - datetime.now(UTC)).total_seconds()
    if left > 0:
        time.sleep(left)


def worker_env(**settings: str) -> dict[str, str]:
    """The environment of a ``sendqueue worker`` process: this checkout's code (``src`` first,
    so a git worktree does not run the editable install's copy), no inherited SENDQUEUE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["COLUMNS"] = "200"
    env.update({f"SENDQUEUE_{k.upper()}": v for k, v in settings.items()})
    return env


class WorkerProcess:
    """One real ``sendqueue worker`` process; its stderr (the log) goes to a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sendqueue.cli", "worker"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process dies where it stands, as in a crash or an OOM kill."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        assert self.proc.returncode == -signal.SIGKILL

    def stop(self) -> int:
        """SIGTERM, then wait for in-flight sends and the exit; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(45)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"the worker did not stop on SIGTERM:\n{self.text()}") from None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass(frozen=True)
class Figures:
    """What the outage did, for the issue's note."""

    sent_before: int
    moved: int
    max_moves: int
    moved_from_a: int
    sent_after: int
    next_days: int
    min_gap_s: float | None
    max_in_half_spacing: int
    max_per_day: int
    per_day: int
    spacing_s: float

    def line(self, layer: str) -> str:
        gap = "n/a" if self.min_gap_s is None else f"{self.min_gap_s:.3f}"
        return (
            f"OUTAGE-FIGURES {layer}: sent_before={self.sent_before} moved={self.moved} "
            f"max_moves={self.max_moves} "
            f"moved_from_window_a={self.moved_from_a} sent_after={self.sent_after} "
            f"pending_next_days={self.next_days} min_gap_s={gap} "
            f"max_sends_within_half_spacing={self.max_in_half_spacing} "
            f"max_per_day={self.max_per_day} per_day_cap={self.per_day} "
            f"spacing_s={self.spacing_s:.1f}"
        )


def _arrival(mail: ReceivedMail) -> datetime:
    return datetime.fromtimestamp(mail.received_at, UTC)


def _max_within(times: list[datetime], span: float) -> int:
    """The most instants of ``times`` (sorted) inside any half-open span of ``span`` seconds."""
    best, lo = 0, 0
    for hi, at in enumerate(times):
        while (at - times[lo]).total_seconds() >= span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def check_outage(
    app: Container,
    campaign_id: str,
    sink: SmtpSink,
    day: TwoWindows,
    original: dict[str, datetime],
    *,
    sent_before: set[str],
    max_lateness: float,
) -> Figures:
    """Assert every promise that must hold after the outage; the figures.

    ``original``: each task's send_at as provisioned. ``sent_before``: the task ids Finished
    when the outage began. ``max_lateness``: the workers' SENDQUEUE_MAX_LATENESS.
    """
    now = datetime.now(UTC)
    policy = day.policy
    tasks: dict[str, Task] = {t.id: t for t in app.store.list_tasks(campaign_id, limit=1000)}
    assert set(tasks) == set(original), "a task appeared or vanished"
    mails = sorted(sink.messages, key=lambda m: m.received_at)
    received = Counter(m.rcpt_tos[0] for m in mails)
    report = [
        f"{t.id} {t.state.value} send_at={t.send_at:%m-%d %H:%M:%S.%f} sent_at={t.sent_at} "
        f"planned_at={t.planned_at} moves={t.moves} "
        f"reason={t.moved_reason!r}"
        for t in sorted(tasks.values(), key=lambda t: t.position)
    ]
    arrivals = [f"{m.rcpt_tos[0]} at {_arrival(m):%H:%M:%S.%f}" for m in mails]
    context = "\n".join(["tasks:", *report, "arrivals:", *arrivals])

    # Nothing sent twice, nothing lost: every task Finished (its email arrived once) or Pending
    # with a future send time and exactly its current schedule in the execution layer.
    assert not received or max(received.values()) == 1, f"an email was sent twice\n{context}"
    finished = {i for i, t in tasks.items() if t.state is TaskState.FINISHED}
    pending = {i for i, t in tasks.items() if t.state is TaskState.PENDING}
    assert finished | pending == set(tasks), f"a task is neither Finished nor Pending\n{context}"
    assert set(received) == {tasks[i].email for i in finished}, f"sent != Finished\n{context}"
    for i in pending:
        assert tasks[i].send_at > now, f"{i} is Pending with a past send_at\n{context}"
    schedules = {s.name: s for s in app.scheduler.list(schedule_group(campaign_id), limit=1000)}
    expected = {expected_schedule_name(tasks[i]): tasks[i] for i in pending}
    assert set(schedules) == set(expected), f"schedules {sorted(schedules)} != {sorted(expected)}"
    for name, task in expected.items():
        assert schedules[name].payload.get("token") == task.token, f"{name}: stale token"
        assert schedules[name].due_at == task.send_at, f"{name}: due_at != send_at"

    # No send outside a window: the planned instants exactly, the SMTP arrivals within the
    # latency slack.
    for t in tasks.values():
        assert day.inside(t.send_at), f"{t.id} planned outside the windows\n{context}"
    for mail in mails:
        at = _arrival(mail)
        assert day.inside(at, before=EARLY_SLACK, after=ARRIVAL_SLACK), (
            f"{mail.rcpt_tos[0]} arrived at {at} outside the windows\n{context}"
        )
    # No burst: planned instants never closer than half the spacing, arrivals likewise (less
    # the latency allowance).
    half = day.spacing / 2
    planned = sorted(t.send_at for t in tasks.values())
    for a, b in itertools.pairwise(planned):
        assert (b - a).total_seconds() >= half - 0.001, (
            f"planned {a} and {b} closer than {half} s\n{context}"
        )
    times = [_arrival(m) for m in mails]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    min_gap = min(gaps) if gaps else None
    assert min_gap is None or min_gap >= half - LATENCY_ALLOWANCE, (
        f"a burst: two arrivals {min_gap:.3f} s apart (half the spacing is {half} s)\n{context}"
    )

    # Each send within the lateness allowance of its (re)planned instant.
    for i in finished:
        t = tasks[i]
        assert t.sent_at is not None
        late = (t.sent_at - t.send_at).total_seconds()
        assert -EARLY_SLACK <= late <= max_lateness + ARRIVAL_SLACK, (
            f"{i} sent {late:.1f} s after its send_at\n{context}"
        )

    # Never more than per_day a local day: what was sent, and what is planned on top of it.
    sent_days = Counter(day.local_day(tasks[i].sent_at or now) for i in finished)
    all_days = Counter(day.local_day(tasks[i].sent_at or now) for i in finished) + Counter(
        day.local_day(tasks[i].send_at) for i in pending
    )
    assert max(sent_days.values(), default=0) <= policy.per_day, f"sent per day {sent_days}"
    assert max(all_days.values(), default=0) <= policy.per_day, (
        f"sent and planned per day {dict(all_days)} over {policy.per_day}\n{context}"
    )

    # Moves are visible: planned_at keeps the first plan; a moved task counts and says why.
    for t in tasks.values():
        assert t.planned_at == original[t.id], f"{t.id}: planned_at {t.planned_at} changed"
        if t.send_at != original[t.id]:
            assert t.moves >= 1, f"{t.id} moved without counting it\n{context}"
            assert t.moved_reason, f"{t.id} moved without a reason\n{context}"
        elif t.moves == 0:
            assert not t.moved_reason, f"{t.id} has a reason but never moved"

    # The emails planned in window A and not sent before the outage: each went out in window
    # B, or (re-planned) waits for a later day; never sent at its old, overdue time.
    today = day.local_day(day.start)
    from_a = [
        t for i, t in tasks.items() if day.in_window(original[i], "A") and i not in sent_before
    ]
    on_time_in_a: list[Task] = []
    for t in from_a:
        if t.state is TaskState.FINISHED and t.send_at == original[t.id]:
            # not moved: only allowed when sent inside A within the lateness allowance
            assert t.sent_at is not None and day.in_window(t.sent_at, "A"), (
                f"{t.id} sent at {t.sent_at} without being re-planned\n{context}"
            )
            on_time_in_a.append(t)
            continue
        assert t.moves >= 1, f"{t.id} was overdue and not re-planned\n{context}"
        if t.state is TaskState.FINISHED:
            # the rest of today: window B (or what was left of A, had any slot been left)
            assert t.sent_at is not None
            assert day.in_window(t.send_at, "B") or day.in_window(t.send_at, "A"), (
                f"{t.id} re-planned to {t.send_at} and sent at {t.sent_at}\n{context}"
            )
        else:
            assert day.local_day(t.send_at) > today, f"{t.id} Pending today\n{context}"
    moved_from_a = len(from_a) - len(on_time_in_a)

    sent_after = len(finished - sent_before)
    return Figures(
        sent_before=len(sent_before),
        moved=sum(1 for t in tasks.values() if t.moves >= 1),
        max_moves=max(t.moves for t in tasks.values()),
        moved_from_a=moved_from_a,
        sent_after=sent_after,
        next_days=sum(1 for i in pending if day.local_day(tasks[i].send_at) > today),
        min_gap_s=min_gap,
        max_in_half_spacing=_max_within(times, half),
        max_per_day=max(all_days.values(), default=0),
        per_day=policy.per_day,
        spacing_s=day.spacing,
    )
