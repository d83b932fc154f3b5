"""A sender's own mailbox may be at another server than the feedback mailbox, which keeps an
``Authentication-Results`` header a stranger wrote claiming the feedback server's id: there
only SENDQUEUE_SENDER_MAILBOX_AUTHSERV is trusted, so such a forgery proves nothing."""

from __future__ import annotations

from typing import Any

import pytest

from sendqueue.bootstrap import bootstrap
from sendqueue.domain.feedback import Feedback, Proof
from sendqueue.domain.reports import parse_feedback
from sendqueue.domain.senders import Sender
from sendqueue.ports import FeedbackSource
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailbox import InMemoryMailbox
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0

FORGED = (
    b"Authentication-Results: mx.google.com; dmarc=pass (p=REJECT) header.from=victim.org;\r\n"
    b" dkim=pass header.i=@victim.org\r\n"
    b"From: Victim <r@victim.org>\r\n"
    b"To: anna@example.com\r\n"
    b"Subject: hello\r\n"
    b"Message-ID: <x1@victim.org>\r\n"
    b"Date: Fri, 04 Dec 2026 10:00:00 +0000\r\n"
    b"\r\n"
    b"hi\r\n"
)


@pytest.mark.parametrize(
    ("sender_ids", "proof"), [("", Proof.NONE), ("mx.google.com", Proof.AUTHENTICATED)]
)
def test_only_the_sender_mailbox_ids_authenticate_a_reply_there(
    sender_ids: str, proof: Proof
) -> None:
    box = InMemoryMailbox("imap://anna@imap.other.example:993/INBOX")
    box.add(FORGED)
    seen: list[Feedback] = []

    def parse(raw: bytes, **kwargs: Any) -> list[Feedback]:
        items = parse_feedback(raw, **kwargs)
        seen.extend(items)
        return items

    def open_mailbox(sender: Sender) -> FeedbackSource:
        return box

    clock = FakeClock(T0)
    app = bootstrap(
        Settings(
            _env_file=None,
            trusted_authserv="mx.google.com",  # the feedback mailbox's server
            sender_mailbox_authserv=sender_ids,
            secret_key="Hq3vN8xLr2Tp6Wd9Ks4Bz7Jm1Fy5Gc0Ae",
        ),
        clock=clock,
        store=InMemoryTaskStore(),
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
        parse_feedback=parse,
        open_mailbox=open_mailbox,
    )
    imap = "imaps://anna:pw@imap.other.example/INBOX"
    app.sender_store.add_sender(Sender(id="s0123456789ab", email="anna@example.com", imap=imap))

    assert app.feedback_poller.poll().messages == 1
    assert [item.proof for item in seen] == [proof]


def test_the_sender_mailbox_ids_are_checked() -> None:
    with pytest.raises(ValueError, match="SENDQUEUE_SENDER_MAILBOX_AUTHSERV"):
        Settings(_env_file=None, sender_mailbox_authserv="mx.google.com, not an id!")
