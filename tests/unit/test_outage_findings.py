"""What the outage integration tests (tests/integration/test_outage.py) found, pinned on a fake
clock so it fails in a second, not in four minutes.

- ``in_policy`` of an instant inside a window is False when the instant has a sub-millisecond
  part (a real clock's ``now`` nearly always has one). The catch-up re-plan asks
  ``in_policy(policy, now)`` to keep the emails due right now; with a real clock it never does,
  and moves them too (the procrastinate run logged 26 moved where the fake clock moves 24).
- Emails due within ``SENDQUEUE_MAX_LATENESS`` when a worker comes back are all sent at once:
  a burst, against "two emails of a campaign are never closer than half the planned spacing".
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy
from sendqueue.services.campaigns.demo import demo_csv
from sendqueue.services.importing.recipients import Templates
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, fake_app
from tests.support.outage import two_windows

POLICY = SendingPolicy(
    timezone="UTC",
    per_day=12,
    weekdays=frozenset(range(7)),
    windows=(Window(8 * 60, 8 * 60 + 1), Window(8 * 60 + 2, 8 * 60 + 3)),
    start=datetime(2026, 12, 1, 7, 0, tzinfo=UTC),
)


@pytest.mark.parametrize("microseconds", [0, 1, 500, 999, 1000, 123_456])
def test_an_instant_inside_a_window_is_in_policy_whatever_its_microseconds(
    microseconds: int,
) -> None:
    at = datetime(2026, 12, 1, 8, 0, 30, tzinfo=UTC) + timedelta(microseconds=microseconds)
    assert in_policy(POLICY, at)


def test_emails_due_together_within_max_lateness_are_not_sent_in_a_burst() -> None:
    """A worker back at T+57 s (window A still open, SENDQUEUE_MAX_LATENESS=20): the catch-up
    moves the emails of T..T+30 s and keeps those of T+40 s and T+50 s, due now and not late;
    both then fire at once, 0 s apart where the spacing is 10 s. (With the default 300 s, all
    six fire at once: tests/integration/test_outage.py, ``[default]``.)"""
    clock = FakeClock(T0 - timedelta(seconds=35))
    scheduler = FakeScheduler(clock, seed=1)
    app = fake_app(clock=clock, scheduler=scheduler, max_lateness=20, space_late_sends=True)
    day = two_windows(clock.now())
    cid = app.campaign_import.create(
        name="late", recipients=demo_csv(26), policy=day.policy,
        templates=Templates(subject="s", body="b"),
    ).campaign.id  # fmt: skip
    app.provisioner.provision(cid)
    clock.set(day.start + timedelta(seconds=57))
    app.recovery.catch_up_overdue()
    scheduler.fire_due(app.invoke)
    sent = sorted(t.sent_at for t in app.store.list_tasks(cid, limit=100) if t.sent_at)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(sent)]
    assert all(gap >= day.spacing / 2 for gap in gaps), f"sends at {sent}"
