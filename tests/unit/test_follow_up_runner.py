"""The follow-up runner: inline it makes a campaign's marked steps in the kicking thread; with
a linger, one thread gathers the kicks and makes each kicked campaign once, at the linger's
end, at 500 kicks of a campaign, or at close. Waits are generous: nothing here times the
machine beyond "within 10 s"."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from sendqueue.services.sequences.runner import FollowUpRunner

#: How long a test waits for something that should happen at once, or after a short linger.
WAIT = 10.0


class Recorder:
    """A ``make`` that records each call (campaign and thread) and can fail for some."""

    def __init__(self, *, failing: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, threading.Thread]] = []
        self.failing = set(failing)
        self.called = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, campaign_id: str) -> None:
        with self._lock:
            self.calls.append((campaign_id, threading.current_thread()))
        self.called.set()
        if campaign_id in self.failing:
            raise RuntimeError(f"store down for {campaign_id}")

    def campaigns(self) -> list[str]:
        with self._lock:
            return [c for c, _ in self.calls]


def _eventually(done: Callable[[], bool]) -> None:
    """Wait until ``done()`` holds, at most :data:`WAIT` seconds."""
    pause = threading.Event()
    for _ in range(int(WAIT * 20)):
        if done():
            return
        pause.wait(0.05)
    assert done()


def test_inline_makes_at_once_in_the_callers_thread() -> None:
    make = Recorder()
    runner = FollowUpRunner(make)
    runner.kick("c1")
    assert make.calls == [("c1", threading.current_thread())]  # before kick returned
    runner.kick("c1")
    assert make.campaigns() == ["c1", "c1"]  # no gathering inline
    runner.close()


def test_inline_an_error_in_make_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    make = Recorder(failing=frozenset({"bad"}))
    runner = FollowUpRunner(make)
    with caplog.at_level(logging.ERROR, logger="sendqueue.services.sequences.runner"):
        runner.kick("bad")
    assert "campaign bad" in caplog.text
    runner.kick("good")
    assert make.campaigns() == ["bad", "good"]


def test_kicks_within_the_linger_make_each_campaign_once_on_the_runners_thread() -> None:
    make = Recorder()
    runner = FollowUpRunner(make, linger=1.0)
    try:
        for _ in range(5):
            runner.kick("c1")
        for _ in range(3):
            runner.kick("c2")
        runner.kick("c1")
        assert make.called.wait(WAIT)  # made without close, at the linger's end
        # both campaigns were gathered in the same pass, which runs them one after the other
        _eventually(lambda: len(make.campaigns()) >= 2)
        assert sorted(make.campaigns()) == ["c1", "c2"]
        assert all(t is not threading.current_thread() for _, t in make.calls)
        assert {t.name for _, t in make.calls} == {"follow-ups"}
    finally:
        runner.close()
    assert sorted(make.campaigns()) == ["c1", "c2"]  # close had nothing left to make


def test_kicks_are_gathered_until_close_which_makes_them_and_stops_the_thread() -> None:
    make = Recorder()
    runner = FollowUpRunner(make, linger=30.0)
    for _ in range(10):
        runner.kick("c1")
    runner.kick("c2")
    assert make.campaigns() == []  # gathered: the linger is long
    runner.close(timeout=WAIT)
    assert make.campaigns() == ["c1", "c2"]  # once each, in the order first kicked
    assert len({t for _, t in make.calls}) == 1
    thread = make.calls[0][1]
    assert not thread.is_alive()


def test_a_later_kick_after_a_pass_is_made_in_the_next_pass() -> None:
    make = Recorder()
    runner = FollowUpRunner(make, linger=0.05)
    try:
        runner.kick("c1")
        assert make.called.wait(WAIT)
        make.called.clear()
        runner.kick("c1")
        assert make.called.wait(WAIT)
        assert make.campaigns() == ["c1", "c1"]
        assert make.calls[0][1] is make.calls[1][1]  # the same thread, kept for the process
    finally:
        runner.close()


def test_500_kicks_of_a_campaign_wake_the_runner_before_its_linger() -> None:
    make = Recorder()
    runner = FollowUpRunner(make, linger=30.0)
    try:
        for _ in range(499):
            runner.kick("c1")
            runner.kick("c2")
        # 499 of each: neither campaign has 500 kicks, the thread still waits for its linger
        assert not make.called.wait(0.5)
        runner.kick("c2")
        assert make.called.wait(WAIT)  # 30 s linger, woken well before
        _eventually(lambda: len(make.campaigns()) >= 2)
        assert sorted(make.campaigns()) == ["c1", "c2"]  # the pass takes every kick waiting
    finally:
        runner.close()
    assert sorted(make.campaigns()) == ["c1", "c2"]


def test_an_error_in_make_is_logged_and_later_kicks_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    make = Recorder(failing=frozenset({"bad"}))
    runner = FollowUpRunner(make, linger=0.05)
    try:
        with caplog.at_level(logging.ERROR, logger="sendqueue.services.sequences.runner"):
            runner.kick("bad")
            assert make.called.wait(WAIT)
            make.called.clear()
            runner.kick("good")
            assert make.called.wait(WAIT)
    finally:
        runner.close()
    assert make.campaigns() == ["bad", "good"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "campaign bad" in errors[0].getMessage()
    assert errors[0].exc_info is not None  # the traceback is logged with it


def test_close_without_a_kick_returns_and_makes_nothing() -> None:
    make = Recorder()
    runner = FollowUpRunner(make, linger=30.0)
    runner.close(timeout=WAIT)
    assert make.calls == []


def test_kicks_that_keep_coming_are_made_after_twenty_lingers_at_the_latest() -> None:
    """A linger of 50 ms, a kick every 10 ms without a pause: the runner does not wait for a
    quiet moment that never comes; it makes them 20 lingers (1 s) after the first."""
    make = Recorder()
    runner = FollowUpRunner(make, linger=0.05)
    stop = threading.Event()

    def keep_kicking() -> None:
        while not stop.is_set() and not make.called.is_set():
            runner.kick("c1")
            stop.wait(0.01)

    kicker = threading.Thread(target=keep_kicking)
    kicker.start()
    try:
        assert make.called.wait(WAIT)
    finally:
        stop.set()
        kicker.join()
        runner.close()
    assert make.campaigns()[0] == "c1"
