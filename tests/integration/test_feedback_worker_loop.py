"""The worker process polls the feedback mailbox and the senders' own mailboxes every interval
(the first time at start), keeps going after a failed pass, picks up a sender given a mailbox
while it runs, and stops with the worker."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.senders import Sender
from sendqueue.ports import FeedbackSource
from sendqueue.services.feedback.poll import PollReport
from sendqueue.settings import Settings
from sendqueue.testing.mailbox import InMemoryMailbox
from tests.support.real import running_worker, wait_until


def _app(tmp_path: Path, sources: list[FeedbackSource] | None) -> Container:
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{tmp_path / 'store.db'}",
        scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        mailer=f"maildir:{tmp_path / 'outbox'}",
    )
    return bootstrap(settings, feedback_sources=sources)


def _pollers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "feedback-poll"]


def test_the_worker_polls_every_interval_and_stops_with_the_worker(tmp_path: Path) -> None:
    box = InMemoryMailbox()
    box.add(b"From: a@example.org\r\nSubject: hi\r\nPrecedence: bulk\r\n\r\nnews\r\n")
    app = _app(tmp_path, [box])
    reports: list[PollReport] = []
    kwargs: dict[str, Any] = {"feedback_interval": 0.05, "on_feedback": reports.append}
    try:
        with running_worker(app, **kwargs):
            wait_until(lambda: len(reports) >= 1, what="the first poll at start")
            assert reports[0].messages == 1
            box.available = False  # a pass that fails is logged; the loop goes on
            fetches = box.fetches
            wait_until(lambda: box.fetches >= fetches + 2, what="polls while the mailbox is down")
            box.available = True
            box.add(b"From: b@example.org\r\nSubject: again\r\nPrecedence: bulk\r\n\r\nnews\r\n")
            wait_until(lambda: sum(r.messages for r in reports) >= 2, what="the second message")
            assert len(_pollers()) == 1
        assert _pollers() == []
        assert app.store.feedback_cursor(box.name) == (1, 2)
        assert sum(r.messages for r in reports) == 2
    finally:
        app.close()


def test_a_sender_given_a_mailbox_later_is_polled_without_a_restart(tmp_path: Path) -> None:
    box = InMemoryMailbox("imap://ann@127.0.0.1:143/INBOX")
    box.add(b"From: a@example.org\r\nSubject: hi\r\nPrecedence: bulk\r\n\r\nnews\r\n")
    app = bootstrap(_app(tmp_path, None).settings, open_mailbox=lambda sender: box)
    reports: list[PollReport] = []
    kwargs: dict[str, Any] = {"feedback_interval": 0.05, "on_feedback": reports.append}
    try:
        with running_worker(app, **kwargs):
            wait_until(lambda: len(reports) >= 2, what="passes with no mailbox at all")
            assert app.feedback_sources == [] and reports[0].mailboxes == 0
            ann = Sender(id="s00000000000a", email="ann@example.com", imap="imap://x:y@h")
            app.sender_store.add_sender(ann)  # as `sender add` writes it, in another process
            wait_until(lambda: sum(r.messages for r in reports) >= 1, what="the sender's mailbox")
            assert len(_pollers()) == 1
        assert _pollers() == []
    finally:
        app.close()
