"""Optional port abilities are declared (attributes, runtime-checkable protocols), not guessed."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler
from sendqueue.adapters.imap import ImapFeedbackSource
from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
from sendqueue.adapters.public_url import PublicUrlProbe
from sendqueue.ports import (
    BackgroundBulkScheduler,
    BulkScheduler,
    Dispatcher,
    FlushableAlarm,
    Probe,
    Target,
)
from sendqueue.runtime import run_worker
from sendqueue.services.scheduling.schedules import _background_writer, _bulk_writer
from sendqueue.testing import FakeClock, FakeScheduler, RecordingAlarm, RecordingMailer
from tests.support.app import T0, fake_app


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


class _Dispatching(FakeScheduler):
    """The fake layer with a dispatcher that idles a moment (time for a reconciler pass)."""

    runs_reconciler = False

    def run(self, target: Target, stop: threading.Event) -> None:
        stop.wait(0.3)


class _ReconcilingDispatching(_Dispatching):
    runs_reconciler = True


@pytest.mark.parametrize(
    ("scheduler_class", "passes"), [(_Dispatching, 1), (_ReconcilingDispatching, 0)]
)
def test_the_worker_runs_a_reconciler_loop_unless_the_dispatcher_does(
    scheduler_class: type[_Dispatching], passes: int
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, scheduler=scheduler_class(clock, seed=1))
    calls: list[None] = []
    app.__dict__["reconciler"] = SimpleNamespace(run=lambda: calls.append(None))
    run_worker(app, threading.Event(), reconcile_interval=60)
    assert len(calls) == passes


def test_the_embedded_and_procrastinate_layers_write_in_bulk_and_a_wrapper_does_not(
    tmp_path: Path,
) -> None:
    embedded = EmbeddedScheduler(f"sqlite:///{tmp_path / 's.db'}", clock=FakeClock())
    try:
        as_object: object = embedded  # no narrowing: embedded stays a Scheduler below
        assert isinstance(as_object, Dispatcher)
        assert _bulk_writer(embedded) is not None
        # the wrapper's own create must see every schedule, so it is not bulk
        assert _bulk_writer(_Forwarding(embedded)) is None
        # and only the embedded layer writes a batch in the background (the same contract)
        assert _background_writer(embedded) is not None
        assert _background_writer(_Forwarding(embedded)) is None
    finally:
        embedded.close()
    assert issubclass(ProcrastinateScheduler, BulkScheduler)  # contract: test_bulk_scheduler
    assert not issubclass(ProcrastinateScheduler, BackgroundBulkScheduler)
    assert not issubclass(EventBridgeScheduler, BulkScheduler)
    fake = FakeScheduler(FakeClock())
    assert _bulk_writer(fake) is None and _background_writer(fake) is None
    assert not isinstance(fake, Dispatcher)


def test_only_the_background_alarm_is_flushable() -> None:
    assert isinstance(LoggingAlarm(), FlushableAlarm)
    assert not isinstance(RecordingAlarm(), FlushableAlarm)


def test_the_parts_check_can_try_declare_a_probe(tmp_path: Path) -> None:
    assert isinstance(SmtpMailer("mx.example.com", 587), Probe)
    assert isinstance(MaildirMailer(tmp_path / "outbox"), Probe)
    assert isinstance(ImapFeedbackSource.from_url("imaps://u:p@imap.example.com/INBOX"), Probe)
    assert isinstance(PublicUrlProbe("https://mail.example.com"), Probe)
    # the check reads these with a port's own call (or says it cannot try them)
    assert not isinstance(RecordingMailer(), Probe)
    assert not isinstance(FakeScheduler(FakeClock()), Probe)
    assert not issubclass(EmbeddedScheduler, Probe)
    assert not issubclass(ProcrastinateScheduler, Probe)
    assert issubclass(EventBridgeScheduler, Probe)
