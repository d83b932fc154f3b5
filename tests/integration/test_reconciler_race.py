"""The reconciler racing a sending worker (issue 16) on real layers: the embedded one (SQLite
store and scheduler) and procrastinate on PostgreSQL (the store in the same database), each
dispatched with its own ``fire_due`` on a fake clock. The fakes run the same scenarios in
``tests/unit/test_reconciler.py``, EventBridge on moto in ``tests/aws/test_reconciler_race.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from tests.support.reconciler_race import Build, Layer, RaceScenarios, fired_through


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
    layer = Layer(app, store, clock, mailer, fired_through(app, fire_due))
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


class TestRacesOnRealLayers(RaceScenarios):
    """The scenarios of tests/support/reconciler_race.py, on each layer of ``build``."""
