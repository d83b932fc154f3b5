"""The reconciler racing a sending worker (issue 16) on real layers: the embedded one (SQLite
store and scheduler) and procrastinate on PostgreSQL (the store in the same database), each
dispatched with its own ``fire_due`` on a fake clock. The fakes run the same scenarios in
``tests/unit/test_reconciler.py``, EventBridge on moto in ``tests/aws/test_lambda.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import bootstrap
from sendqueue.ports import Target
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.support.app import LENIENT_LATENESS, T0
from tests.support.faults import Meanwhile
from tests.support.reconciler_race import (
    Layer,
    listing_races_a_send,
    recreate_races_a_re_plan,
    stale_read_races_the_worker,
)

Build = Callable[..., Layer]


def _layer(clock: FakeClock, database_url: str, opened: list[Layer], **settings: Any) -> Layer:
    store = Meanwhile(open_store(database_url))
    mailer = RecordingMailer()
    values: dict[str, Any] = {
        "_env_file": None,
        "database_url": database_url,
        "max_lateness": LENIENT_LATENESS,
        "space_late_sends": False,
    }
    values.update(settings)
    app = bootstrap(Settings(**values), clock=clock, store=store, mailer=mailer)
    fire_due: Callable[[Target], int] = app.scheduler.fire_due  # type: ignore[attr-defined]

    def fire() -> list[str]:
        invoked: list[str] = []

        def target(payload: Mapping[str, str]) -> None:
            invoked.append(payload["task_id"])
            app.invoke(payload)

        fire_due(target)
        return invoked

    layer = Layer(app, store, clock, mailer, fire)
    opened.append(layer)
    return layer


@pytest.fixture(params=["embedded", pytest.param("procrastinate", marks=pytest.mark.postgres)])
def build(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Build]:
    opened: list[Layer] = []

    def embedded(**settings: Any) -> Layer:
        return _layer(
            FakeClock(T0),
            f"sqlite:///{tmp_path / 'store.db'}",
            opened,
            scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
            **settings,
        )

    def procrastinate(**settings: Any) -> Layer:
        url = request.getfixturevalue("postgres_url")
        # Near the real now, as the adapter's other tests: its jobs are due by this clock.
        return _layer(
            FakeClock(SystemClock().now()), url, opened, execution="procrastinate", **settings
        )

    yield {"embedded": embedded, "procrastinate": procrastinate}[request.param]
    for layer in opened:
        layer.app.close()


@pytest.mark.parametrize("lost", [False, True], ids=["race-only", "race-and-a-real-loss"])
def test_a_schedule_that_went_with_its_sent_task_is_not_recreated(
    build: Build, lost: bool, caplog: pytest.LogCaptureFixture
) -> None:
    listing_races_a_send(build(), caplog, lost=lost)


@pytest.mark.parametrize("policy", ["retry", "fail"])
@pytest.mark.parametrize("meanwhile", ["finished", "reclaimed"])
def test_a_stale_task_that_moved_on_since_the_read_is_left_alone(
    build: Build, policy: str, meanwhile: str, caplog: pytest.LogCaptureFixture
) -> None:
    layer = build(stale_policy=policy, stale_after=900)
    stale_read_races_the_worker(layer, caplog, meanwhile=meanwhile)


def test_a_schedule_made_after_the_recheck_is_not_replaced_by_the_passs_older_read(
    build: Build,
) -> None:
    recreate_races_a_re_plan(build())
