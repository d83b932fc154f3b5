"""A three-step sequence through real mail servers: every step goes out through Postfix into
each recipient's own Dovecot mailbox, where it is read back over IMAP (its thread headers and
subject); a reply from one recipient, mailed through Postfix into the sender's mailbox and read
by the feedback poller, ends that recipient's sequence only; Postfix's own DSN for an unknown
user ends that one's. The clock is a fake one (minute delays), the mail servers are real.
"""

from __future__ import annotations

import email
import email.policy
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast

import pytest

from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.domain.senders import Sender
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.services.feedback.effects import REPLIED_REASON
from sendqueue.services.feedback.poll import PollReport
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import LENIENT_LATENESS, T0, open_policy
from tests.support.feedback_mail import message
from tests.support.mailservers import (
    BOUNCE_DOMAIN,
    ERROR_DOMAIN,
    INBOX_DOMAIN,
    Dovecot,
    Postfix,
    dovecot_missing,
    running_dovecot,
    running_postfix,
)

SECRET = "s" * 8 + "0123456789abcdef" * 2
SENDER = Sender(id="s000000000001", email=f"news@{INBOX_DOMAIN}")
ANN, BOB, GONE = f"ann@{INBOX_DOMAIN}", f"bob@{INBOX_DOMAIN}", f"gone@{ERROR_DOMAIN}"
STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts, {{ name }}?\n", None, parse_delay("1m")),
    Step(3, None, "Last note, {{ name }}.\n", None, parse_delay("2m")),
)


@pytest.fixture
def mail(mail_root: Path) -> Iterator[tuple[Postfix, Dovecot]]:
    """Dovecot with a mailbox for the sender and each recipient, and Postfix delivering to it."""
    reason = dovecot_missing()
    if reason:
        from tests.conftest import missing

        missing(reason)
    with (
        running_dovecot(mail_root, extra_users=("news", "ann", "bob")) as dovecot,
        running_postfix(dovecot, mail_root) as postfix,
    ):
        yield postfix, dovecot


def _app(clock: FakeClock, store: SqlTaskStore, postfix: Postfix, dovecot: Dovecot) -> Container:
    settings = Settings(
        _env_file=None,
        bounce_address=f"bounces@{BOUNCE_DOMAIN}",
        secret_key=SECRET,
        feedback_imap=dovecot.url,
        max_lateness=LENIENT_LATENESS,
        space_late_sends=False,
        follow_up_linger=0,  # each step's next one made at its send, as the test fires them
    )
    mailer = SmtpMailer("127.0.0.1", postfix.port, security="none", timeout=10)
    scheduler = FakeScheduler(clock, seed=1)
    return bootstrap(settings, clock=clock, store=store, scheduler=scheduler, mailer=mailer)


def _inbox(dovecot: Dovecot, user: str) -> list[EmailMessage]:
    """Every message of ``user``'s INBOX, in arrival order, read over IMAP."""
    client = cast(Any, dovecot.client(user))
    try:
        client.select_folder("INBOX", readonly=True)
        fetched = client.fetch(client.search("ALL"), ["RFC822"])
        return [
            email.message_from_bytes(fetched[uid][b"RFC822"], policy=email.policy.default)
            for uid in sorted(fetched)
        ]
    finally:
        client.logout()


def _header(mail: EmailMessage, name: str) -> str | None:
    """A header's value unfolded (a long Message-ID is folded onto its own line)."""
    value = mail[name]
    return None if value is None else " ".join(str(value).split())


def _wait_for(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _poll_until(app: Container, done: Callable[[PollReport], bool]) -> PollReport:
    total = PollReport()

    def one_pass() -> bool:
        report = app.feedback_poller.poll()
        assert report.errors == []
        for key in ("messages", "bounces", "replies"):
            setattr(total, key, getattr(total, key) + getattr(report, key))
        return done(total)

    _wait_for("the feedback", one_pass)
    return total


def _fire(app: Container) -> int:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    return scheduler.fire_due(app.invoke)


def _task(store: SqlTaskStore, cid: str, position: int, step: int) -> Task | None:
    return store.get_task(task_id(cid, position, step))


def _created(app: Container, dovecot: Dovecot) -> str:
    # the sender's own mailbox, where replies land, is read by the feedback poller
    app.sender_store.add_sender(replace(SENDER, imap=dovecot.url_of("news")))
    rows = f"email,name\n{ANN},Ann\n{BOB},Bob\n{GONE},Gone\n"
    cid = app.campaign_import.create(
        name="seq-real",
        recipients=rows.encode(),
        policy=open_policy(T0),
        steps=STEPS,
        senders=[SENDER.id],
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def test_a_sequence_through_postfix_and_dovecot_stops_for_a_reply_and_a_bounce_only(
    mail: tuple[Postfix, Dovecot], tmp_path: Path
) -> None:
    postfix, dovecot = mail
    clock = FakeClock(T0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    app = _app(clock, store, postfix, dovecot)
    try:
        cid = _created(app, dovecot)
        clock.advance(minutes=5)
        assert _fire(app) == 3  # step 1 to all three; each one's step 2 is made at its send
        _wait_for(
            "step 1 in both mailboxes", lambda: all(_inbox(dovecot, u) for u in ("ann", "bob"))
        )
        _stops(app, store, dovecot, postfix, cid)

        clock.advance(minutes=2)
        assert _fire(app) == 1  # Bob's step 2, the others' were cancelled
        assert _task(store, cid, 1, 3) is not None
        clock.advance(minutes=3)
        assert _fire(app) == 1  # Bob's step 3
        _wait_for("Bob's 3 steps", lambda: len(_inbox(dovecot, "bob")) == 3)
        _bobs_thread(store, dovecot, cid)
        assert [m["Subject"] for m in _inbox(dovecot, "ann")] == ["Hello Ann"]
    finally:
        app.close()


def _stops(
    app: Container, store: SqlTaskStore, dovecot: Dovecot, postfix: Postfix, cid: str
) -> None:
    """Postfix's DSN for the unknown user and Ann's reply to step 1, through the poller, cancel
    their step 2 and nothing else."""
    report = _poll_until(app, lambda total: total.bounces >= 1)
    assert report.bounces == 1
    gone = _task(store, cid, 2, 2)
    assert gone is not None and gone.state is TaskState.CANCELLED, gone

    ann_first = _task(store, cid, 0, 1)
    assert ann_first is not None and ann_first.message_id is not None
    [received] = _inbox(dovecot, "ann")
    assert _header(received, "Message-ID") == ann_first.message_id
    assert received["From"].addresses[0].addr_spec == SENDER.email
    reply = message(
        {
            "From": f"Ann <{ANN}>",
            "To": SENDER.email,
            "Subject": "Re: Hello Ann",
            "Message-ID": f"<reply-ann@{INBOX_DOMAIN}>",
            "In-Reply-To": ann_first.message_id,
            "References": ann_first.message_id,
        },
        "Thanks, not now.",
    )
    postfix.submit(reply, mail_from=ANN, to=SENDER.email)
    assert _poll_until(app, lambda total: total.replies >= 1).replies == 1
    replied = store.get_task(ann_first.id)
    assert replied is not None and replied.outcome is TaskOutcome.REPLIED
    ann_second = _task(store, cid, 0, 2)
    assert ann_second is not None
    assert (ann_second.state, ann_second.reason) == (TaskState.CANCELLED, REPLIED_REASON)
    bob_second = _task(store, cid, 1, 2)
    assert bob_second is not None and bob_second.state is TaskState.PENDING


def _bobs_thread(store: SqlTaskStore, dovecot: Dovecot, cid: str) -> None:
    """Bob got all three steps, in one thread, steps 2 and 3 under step 1's subject; nobody
    else got a later step."""
    tasks = [_task(store, cid, 1, k) for k in (1, 2, 3)]
    assert all(t is not None and t.state is TaskState.FINISHED for t in tasks)
    ids = [t.message_id for t in tasks if t is not None]
    first, second, third = _inbox(dovecot, "bob")
    assert [_header(m, "Message-ID") for m in (first, second, third)] == ids
    assert [m["Subject"] for m in (first, second, third)] == [
        "Hello Bob",
        "Re: Hello Bob",
        "Re: Hello Bob",
    ]
    assert first["In-Reply-To"] is None and first["References"] is None
    thread = [(_header(m, "In-Reply-To"), _header(m, "References")) for m in (second, third)]
    assert thread == [(ids[0], ids[0]), (ids[1], f"{ids[0]} {ids[1]}")]
    assert "Any thoughts, Bob?" in second.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    for position in (0, 2):
        assert _task(store, cid, position, 3) is None
