"""Each sender's own mailbox, read by ``sendqueue feedback poll`` from a real Dovecot serving one
user per sender: a reply to sender B's email, written into B's mailbox, cancels the recipient's
Pending emails from B and leaves those from A (campaigns made with ``--sender`` share the
default From); a sender whose mailbox refuses its password is reported, masked, in ``sender
show``, and does not stop the other's reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task
from sendqueue.domain.senders import Sender
from sendqueue.services.feedback.effects import REPLIED_REASON
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import LENIENT_LATENESS, T0, open_policy
from tests.support.feedback_mail import message
from tests.support.mailservers import Dovecot

SECRET = "k" * 8 + "0123456789abcdef" * 2
DEFAULT_FROM = "news@example.com"
RECIPIENT = "rita@example.org"
WRONG = "Wrong-Password-7731"


def _env(tmp_path: Path, dovecot: Dovecot) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=f"maildir:{tmp_path / 'outbox'}",
        SENDQUEUE_SECRET_KEY=SECRET,
        SENDQUEUE_DEFAULT_FROM=DEFAULT_FROM,
        SENDQUEUE_FEEDBACK_IMAP=dovecot.url,
    )
    return env


def _cli(tmp_path: Path, dovecot: Dovecot, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "sendqueue.cli", *args],
        capture_output=True,
        text=True,
        env=_env(tmp_path, dovecot),
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    for user in dovecot.users.values():
        assert user.password not in done.stdout + done.stderr
    assert WRONG not in done.stdout + done.stderr
    return done


def _campaign(app: Container, name: str, sender: str, days: int) -> str:
    """A campaign from ``sender`` (no From: the default one) to the recipient and another."""
    rows = f"email,subject,body\n{RECIPIENT},Hello,Hi\nother-{name}@example.org,Hello,Hi\n"
    cid = app.campaign_import.create(
        name=name,
        recipients=rows.encode(),
        policy=open_policy(T0 + timedelta(days=days)),
        senders=[sender],
    ).campaign.id
    app.provisioner.provision(cid)
    return cid


def _task_to(store: SqlTaskStore, cid: str) -> Task:
    found = [t for t in store.list_tasks(cid) if t.email == RECIPIENT]
    assert len(found) == 1
    return found[0]


def _reply(dovecot: Dovecot, user: str, to: str, message_id: str) -> None:
    """The recipient's answer to ``message_id``, appended to ``user``'s INBOX over IMAP."""
    raw = message(
        {
            "From": f"Rita <{RECIPIENT}>",
            "To": to,
            "Subject": "Re: Hello",
            "Message-ID": f"<re-{os.urandom(4).hex()}@example.org>",
            "In-Reply-To": message_id,
            "References": message_id,
        },
        "Thanks, not now.",
    )
    client = cast(Any, dovecot.client(user))
    try:
        client.append("INBOX", raw)
    finally:
        client.logout()


def test_a_reply_in_a_senders_mailbox_cancels_only_that_senders_emails(
    dovecot_users: Dovecot, tmp_path: Path
) -> None:
    dovecot = dovecot_users
    clock = FakeClock(T0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    settings = Settings(
        _env_file=None,
        secret_key=SECRET,
        default_from=DEFAULT_FROM,
        max_lateness=LENIENT_LATENESS,
        space_late_sends=False,
    )
    scheduler = FakeScheduler(clock, seed=1)
    app = bootstrap(
        settings, clock=clock, store=store, scheduler=scheduler, mailer=RecordingMailer()
    )
    try:
        # A's mailbox URL carries a wrong password; B's is right.
        ann = Sender(
            id="s00000000000a",
            email="ann@sender.example",
            imap=dovecot.url_of("ann", password=WRONG),
        )
        bob = Sender(id="s00000000000b", email="bob@sender.example", imap=dovecot.url_of("bob"))
        app.sender_store.add_sender(ann)
        app.sender_store.add_sender(bob)
        sent = {s.id: _campaign(app, f"now-{s.id}", s.id, days=0) for s in (ann, bob)}
        later = {s.id: _campaign(app, f"later-{s.id}", s.id, days=30) for s in (ann, bob)}
        clock.advance(days=1)
        assert scheduler.fire_due(app.invoke) == 4
        answered = _task_to(store, sent[bob.id])
        assert answered.state is TaskState.FINISHED and answered.sender == bob.email
        assert answered.message_id is not None
        _reply(dovecot, "bob", bob.email, answered.message_id)
    finally:
        app.close()

    done = _cli(tmp_path, dovecot, "feedback", "poll", "--json")
    assert done.returncode == 3  # one mailbox could not be read; the others were
    report = json.loads(done.stdout)
    assert (report["mailboxes"], report["messages"], report["replies"]) == (3, 1, 1)
    assert len(report["errors"]) == 1 and "imap://ann@127.0.0.1" in report["errors"][0]

    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        replied = store.get_task(answered.id)
        assert replied is not None and replied.outcome is TaskOutcome.REPLIED
        from_bob = _task_to(store, later[bob.id])
        assert (from_bob.state, from_bob.reason) == (TaskState.CANCELLED, REPLIED_REASON)
        assert _task_to(store, later[ann.id]).state is TaskState.PENDING
        others = [t for t in store.list_tasks(later[bob.id]) if t.email != RECIPIENT]
        assert [t.state for t in others] == [TaskState.PENDING]

        shown = _cli(tmp_path, dovecot, "sender", "show", ann.id)
        assert shown.returncode == 0, shown.stderr
        assert f"mailbox: imap://ann@127.0.0.1:{dovecot.port}/INBOX, last read" in shown.stdout
        assert "mailbox error: " in shown.stdout and "AUTHENTICATIONFAILED" in shown.stdout
        bob_json = json.loads(_cli(tmp_path, dovecot, "sender", "show", bob.id, "--json").stdout)
        assert bob_json["mailbox"]["messages_read"] == 1
        assert bob_json["mailbox"]["last_error"] is None
        assert bob_json["mailbox"]["polled_at"] is not None

        # The right password: the same mailbox (its cursor and state kept), its error cleared.
        store.update_sender(replace(ann, imap=dovecot.url_of("ann")))
    finally:
        store.close()
    assert _cli(tmp_path, dovecot, "feedback", "poll").returncode == 0
    ann_json = json.loads(_cli(tmp_path, dovecot, "sender", "show", ann.id, "--json").stdout)
    assert ann_json["mailbox"]["last_error"] is None
    assert ann_json["mailbox"]["mailbox"] == f"imap://ann@127.0.0.1:{dovecot.port}/INBOX"
