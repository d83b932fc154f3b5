"""Provisioning's continuation hook and its time-left question (what the Lambda handler uses)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import CONTROL_GROUP, expected_schedule_name, schedule_group
from sendqueue.services.scheduling.provisioning import Provisioner
from tests.support.app import csv_bytes, fake_app, open_policy

# The apps here provision in chunks of 500 (provision_chunk=500): the figures below (progress,
# checkpoints, crashes after so many inserts) are worked out for that size.


def _create(app: Container, count: int) -> str:
    return app.campaign_import.create(
        name="p", recipients=csv_bytes(count), policy=open_policy()
    ).campaign.id


def _countdown(start: float, step: float) -> tuple[list[float], Callable[[], float]]:
    asked: list[float] = []

    def time_left() -> float:
        left = start - step * len(asked)
        asked.append(left)
        return left

    return asked, time_left


def test_time_left_is_asked_before_every_chunk_and_the_hook_gets_the_saved_checkpoint() -> None:
    app = fake_app(provision_chunk=500)
    cid = _create(app, 2000)  # four chunks of 500
    handed: list[tuple[str, dict[str, object]]] = []

    def hand_on(campaign_id: str, checkpoint: dict[str, object]) -> None:
        # called after the lease is released: the next run may start at once
        assert app.store.acquire_lease(
            f"provision:{campaign_id}", "next", ttl_seconds=60, at=app.clock.now()
        )
        app.store.release_lease(f"provision:{campaign_id}", "next")
        handed.append((campaign_id, checkpoint))

    asked, time_left = _countdown(100.0, 4.0)  # 100, 96, 92, then 88 <= 90
    report = app.provisioner.provision(
        cid,
        time_left=time_left,
        safety_margin=90,
        continuation=hand_on,
    )
    assert report.status == "continued"
    assert asked == [100.0, 96.0, 92.0, 88.0]
    [(campaign_id, checkpoint)] = handed
    assert campaign_id == cid
    assert checkpoint == app.store.get_campaign(cid).checkpoint
    assert checkpoint["phase"] == "tasks" and checkpoint["after"] == 1499
    assert app.scheduler.list(CONTROL_GROUP) == []  # the hook replaced the control schedule

    done = app.provisioner.provision(cid, continuation=hand_on)
    assert done.status == "done" and len(handed) == 1
    tasks = app.store.list_tasks(cid, limit=3000)
    assert [t.position for t in tasks] == list(range(2000))
    names = [s.name for s in app.scheduler.list(schedule_group(cid), limit=3000)]
    assert Counter(names) == Counter(expected_schedule_name(t) for t in tasks)
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE


def test_the_constructor_hook_serves_runs_that_name_none_and_its_failure_is_raised() -> None:
    app = fake_app(provision_chunk=500)
    cid = _create(app, 600)

    def broken(campaign_id: str, checkpoint: dict[str, object]) -> None:
        raise RuntimeError("the Lambda API is down")

    provisioner = Provisioner(
        app.store,
        app.scheduler,
        app.writer,
        app.clock,
        app.config,
        continuation=broken,
        suppressions=app.stores.suppressions,
        capacity=app.capacity,
    )
    with pytest.raises(RuntimeError, match="Lambda API is down"):
        provisioner.provision(cid, time_budget=1e-9, safety_margin=0)
    # the checkpoint was saved and the lease released: a retry resumes and finishes
    assert app.store.get_campaign(cid).state is CampaignState.PROVISIONING
    assert provisioner.provision(cid).status == "done"
    assert len(app.store.list_tasks(cid, limit=1000)) == 600
