"""The isolated feedback parser (sendqueue.adapters.parser): each message parsed in a child
process within a time budget. A parse past the budget is killed and its message skipped, and
the message behind it still applied in the same poll; a child that dies mid-parse or a parse
that raises skips only its message; every keyword argument reaches the parse function; close()
leaves no child behind; a child that cannot start stops the pass before its cursor moves; the
child never runs the parent's ``__main__`` module."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sendqueue.adapters.parser import IsolatedParser
from sendqueue.adapters.parser.process import NICE
from sendqueue.domain.errors import FeedbackParseFailed, FeedbackUnavailable
from sendqueue.domain.lifecycle import TaskOutcome
from sendqueue.testing.mailbox import InMemoryMailbox
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.parsers import scripted
from tests.unit.test_feedback_poll import _app, _sent

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _gone(pid: int) -> bool:
    """The process ``pid`` no longer exists (and is no child of ours, not even a zombie)."""
    children = [p.pid for p in multiprocessing.active_children()]
    return not Path(f"/proc/{pid}").exists() and pid not in children


def test_a_parse_past_the_budget_is_killed_and_the_message_behind_it_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parser = IsolatedParser(scripted, seconds=0.5)
    box = InMemoryMailbox()
    app = _app(box, parse=parser)
    try:
        cid = _sent(app, 1)
        box.add(b"sleep a minute")
        box.add(f"reply {cid}-0".encode())
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="sendqueue"):
            report = app.feedback_poller.poll()
        elapsed = time.monotonic() - started
        assert (report.messages, report.skipped, report.replies) == (2, 1, 1)
        [task] = app.store.list_tasks(cid)
        assert task.outcome is TaskOutcome.REPLIED
        assert elapsed < 30  # the sleeping parse was not waited for (it takes 60 s)
        [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert line == (
            f"feedback message {box.name}:1:1 skipped: parsing took longer than its budget of "
            "0.5 s; its parser process was killed (the next message starts a new one)"
        )
        store = app.store
        assert isinstance(store, InMemoryTaskStore)
        assert store.feedback_cursor(box.name) == (1, 2)
    finally:
        app.close()


def test_the_killed_child_is_gone_and_the_next_message_starts_another() -> None:
    parser = IsolatedParser(scripted, seconds=0.5)
    try:
        assert parser(b"nothing", received_at=NOW) == []
        first = parser.pid
        assert first is not None
        with pytest.raises(FeedbackParseFailed, match=r"longer than its budget of 0\.5 s"):
            parser(b"sleep", received_at=NOW)
        assert parser.pid is None
        assert _gone(first)
        assert parser(b"nothing", received_at=NOW) == []
        assert parser.pid not in (None, first)
    finally:
        parser.close()


def test_a_child_that_dies_mid_parse_skips_only_its_message() -> None:
    parser = IsolatedParser(scripted, seconds=10)
    box = InMemoryMailbox()
    app = _app(box, parse=parser)
    try:
        cid = _sent(app, 1)
        box.add(b"die now")
        box.add(f"reply {cid}-0".encode())
        assert parser(b"nothing", received_at=NOW) == []
        first = parser.pid
        assert first is not None
        with pytest.raises(FeedbackParseFailed, match=r"died \(exit code -9\)"):
            parser(b"die", received_at=NOW)
        assert _gone(first)
        report = app.feedback_poller.poll()
        assert (report.messages, report.skipped, report.replies) == (2, 1, 1)
    finally:
        app.close()


def test_a_parse_that_raises_is_one_line_and_the_child_goes_on() -> None:
    parser = IsolatedParser(scripted, seconds=10)
    try:
        assert parser(b"nothing", received_at=NOW) == []
        pid = parser.pid
        with pytest.raises(FeedbackParseFailed) as info:
            parser(b"boom", received_at=NOW)
        assert str(info.value) == "the parser raised ValueError: unparseable\nand a second line"
        assert parser.pid == pid  # no new process for an exception
    finally:
        parser.close()


def test_every_keyword_argument_reaches_the_parse_function_unchanged() -> None:
    parser = IsolatedParser(scripted, seconds=10)
    try:
        [item] = parser(
            b"kwargs",
            received_at=NOW,
            key="box:sha256:abc",
            bounce_address=None,
            secret="s" * 32,
            trusted_authserv=("mx.example.com",),  # a keyword the poller does not pass yet
        )
    finally:
        parser.close()
    assert item.detail is not None
    assert json.loads(item.detail) == {
        "received_at": repr(NOW),
        "key": "'box:sha256:abc'",
        "bounce_address": "None",
        "secret": repr("s" * 32),
        "trusted_authserv": "('mx.example.com',)",
    }


def test_the_child_runs_at_a_lower_cpu_priority() -> None:
    # On a busy machine the web requests of the parent get the CPU before a parse.
    parser = IsolatedParser(scripted, seconds=10)
    try:
        [item] = parser(b"nice", received_at=NOW)
    finally:
        parser.close()
    assert item.detail == str(min(os.nice(0) + NICE, 19))


def test_close_leaves_no_child_process() -> None:
    parser = IsolatedParser(scripted, seconds=10)
    assert parser.pid is None  # started at the first message, not before
    assert parser(b"nothing", received_at=NOW) == []
    pid = parser.pid
    assert pid is not None and Path(f"/proc/{pid}").exists()
    parser.close()
    assert parser.pid is None
    assert _gone(pid)
    parser.close()  # twice is harmless


def test_the_parse_function_must_be_importable_by_name() -> None:
    with pytest.raises(TypeError, match="importable by name"):
        IsolatedParser(lambda raw, **kw: [], seconds=1)


def test_a_child_that_cannot_start_stops_the_pass_and_skips_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parse function's module is gone by the time the child imports it.
    module = tmp_path / "vanishing_parse.py"
    module.write_text("def parse(raw, **kwargs):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing_parse  # type: ignore[import-not-found]

    parser = IsolatedParser(vanishing_parse.parse, seconds=1, start_seconds=30)
    module.unlink()
    monkeypatch.delitem(sys.modules, "vanishing_parse")
    box = InMemoryMailbox()
    box.add(b"newsletter")
    app = _app(box, parse=parser)
    try:
        report = app.feedback_poller.poll()
    finally:
        app.close()
    [error] = report.errors
    assert error.startswith(f"{box.name}: the feedback parser process did not start")
    assert report.skipped == 0
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) is None
    with pytest.raises(FeedbackUnavailable):
        parser(b"x", received_at=NOW)


def test_the_child_never_runs_the_main_module_of_a_program_without_a_main_guard(
    tmp_path: Path,
) -> None:
    # multiprocessing's "spawn" imports the parent's __main__ in the child: a program that
    # embeds sendqueue without `if __name__ == "__main__"` ran again there, and every parse
    # failed ("an attempt has been made to start a new process before ... bootstrapping").
    script = tmp_path / "embedding.py"
    script.write_text(
        textwrap.dedent(
            """\
            from datetime import UTC, datetime
            from sendqueue.adapters.parser import IsolatedParser
            from tests.support.parsers import scripted
            parser = IsolatedParser(scripted, seconds=10)
            print("items:", len(parser(b"kwargs", received_at=datetime.now(UTC))), flush=True)
            parser.close()
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["items: 1"]
