"""The embedded dispatcher's claiming ahead (``lookahead``): real threads, a real SQLite file.

The dispatcher leases schedules shortly before they fall due and its fire threads wait for the
due time; these tests use a long lookahead (up to 1 s) so each step can be observed: the lease
is visible before the due time, and what happens to it then (delete, replace, stop) decides.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.testing.alarm import RecordingAlarm
from tests.integration.test_embedded_dispatcher import (
    Recorder,
    create_due,
    dispatching,
    now,
    wait_for,
)

pytestmark = pytest.mark.slow


def open_scheduler(tmp_path: Path, lookahead: float) -> EmbeddedScheduler:
    return EmbeddedScheduler(
        f"sqlite:///{tmp_path / 'scheduler.db'}", alarm=RecordingAlarm(), lookahead=lookahead
    )


def leased(scheduler: EmbeddedScheduler, name: str) -> Callable[[], bool]:
    return lambda: name in scheduler.leases()


def test_schedules_claimed_ahead_fire_at_their_time_never_before(tmp_path: Path) -> None:
    target = Recorder()
    start = now()
    dues = {f"sq-{i}": start + timedelta(seconds=0.4 + 0.05 * i) for i in range(12)}
    with open_scheduler(tmp_path, lookahead=1.0) as scheduler:
        for name, due in dues.items():
            create_due(scheduler, name, due)
        with dispatching(scheduler, target):
            wait_for(leased(scheduler, "sq-0"), 5, "sq-0 to be claimed")
            claimed_at = now()
            wait_for(lambda: len(target.calls) == len(dues), 10, "every schedule to fire")
        assert claimed_at < dues["sq-0"], "not claimed ahead of its due time"
        assert sorted(target.names) == sorted(dues)
        for name, due in dues.items():
            lateness = (target.first_call(name) - due).total_seconds()
            assert 0 <= lateness < 0.5, (name, lateness)
            assert scheduler.get(name) is None


def test_a_schedule_deleted_after_its_claim_but_before_its_time_does_not_fire(
    tmp_path: Path,
) -> None:
    target = Recorder()
    due = now() + timedelta(seconds=0.8)
    with open_scheduler(tmp_path, lookahead=1.0) as scheduler:
        create_due(scheduler, "sq-cancelled", due)
        create_due(scheduler, "sq-kept", due + timedelta(seconds=0.1))
        with dispatching(scheduler, target):
            wait_for(leased(scheduler, "sq-cancelled"), 5, "the claim ahead")
            assert now() < due
            scheduler.delete("sq-cancelled")
            wait_for(lambda: "sq-kept" in target.names, 5, "sq-kept to fire")
        assert target.names == ["sq-kept"]
        assert scheduler.get("sq-cancelled") is None


def test_a_schedule_replaced_after_its_claim_fires_once_as_the_new_one(tmp_path: Path) -> None:
    target = Recorder()
    due = now() + timedelta(seconds=0.8)
    with open_scheduler(tmp_path, lookahead=1.0) as scheduler:
        create_due(scheduler, "sq-a", due)
        with dispatching(scheduler, target):
            wait_for(leased(scheduler, "sq-a"), 5, "the claim ahead")
            scheduler.delete("sq-a")
            scheduler.create("sq-a", "g", due.replace(tzinfo=None), "UTC", {"task_id": "new"}, "t2")
            wait_for(lambda: target.names == ["new"], 5, "the new schedule to fire")
            wait_for(lambda: scheduler.get("sq-a") is None, 5, "the new schedule's delete")
        assert target.names == ["new"]


def test_stopping_releases_what_was_claimed_ahead_without_firing_it(tmp_path: Path) -> None:
    target = Recorder()
    due = now() + timedelta(seconds=0.9)
    with open_scheduler(tmp_path, lookahead=1.0) as scheduler:
        create_due(scheduler, "sq-a", due)
        with dispatching(scheduler, target):
            wait_for(leased(scheduler, "sq-a"), 5, "the claim ahead")
            assert now() < due
        assert target.calls == []
        assert scheduler.leases() == {}
        assert scheduler.get("sq-a") is not None


@pytest.mark.parametrize(("lookahead", "lease"), [(-0.01, 60.0), (1.5, 60.0), (0.5, 1.2)])
def test_lookahead_out_of_range_is_refused(tmp_path: Path, lookahead: float, lease: float) -> None:
    with pytest.raises(ValueError, match="lookahead"):
        EmbeddedScheduler(
            f"sqlite:///{tmp_path / 'scheduler.db'}", lookahead=lookahead, lease_seconds=lease
        )


def test_a_private_in_memory_database_does_not_claim_ahead() -> None:
    with EmbeddedScheduler("sqlite://", lookahead=0.5) as scheduler:
        assert scheduler.lookahead == 0.0
