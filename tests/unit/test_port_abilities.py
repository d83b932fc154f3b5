"""Optional port abilities are declared (attributes, runtime-checkable protocols), not guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.embedded_scheduler import EmbeddedScheduler
from sendqueue.adapters.eventbridge_scheduler import EventBridgeScheduler
from sendqueue.adapters.procrastinate_scheduler import ProcrastinateScheduler
from sendqueue.ports import BulkScheduler, Dispatcher, FlushableAlarm
from sendqueue.services.scheduling import _bulk_writer
from sendqueue.testing import FakeClock, FakeScheduler, RecordingAlarm


class _Forwarding:
    """A wrapper that forwards every unknown attribute (as the fault injectors do)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_every_scheduler_declares_its_firing_precision() -> None:
    assert EmbeddedScheduler.firing_precision == 0.0
    assert ProcrastinateScheduler.firing_precision == 0.0
    assert FakeScheduler.firing_precision == 0.0
    assert EventBridgeScheduler.firing_precision == 60.0


def test_every_dispatcher_says_whether_it_runs_the_reconciler() -> None:
    assert EmbeddedScheduler.runs_reconciler is False
    assert ProcrastinateScheduler.runs_reconciler is True
    assert not issubclass(EventBridgeScheduler, BulkScheduler)


def test_only_the_embedded_layer_writes_in_bulk_and_a_wrapper_does_not(tmp_path: Path) -> None:
    embedded = EmbeddedScheduler(f"sqlite:///{tmp_path / 's.db'}", clock=FakeClock())
    try:
        assert isinstance(embedded, Dispatcher)
        assert _bulk_writer(embedded) is not None
        # the wrapper's own create must see every schedule, so it is not bulk
        assert _bulk_writer(_Forwarding(embedded)) is None
    finally:
        embedded.close()
    fake = FakeScheduler(FakeClock())
    assert _bulk_writer(fake) is None
    assert not isinstance(fake, Dispatcher)


def test_only_the_background_alarm_is_flushable() -> None:
    assert isinstance(LoggingAlarm(), FlushableAlarm)
    assert not isinstance(RecordingAlarm(), FlushableAlarm)
