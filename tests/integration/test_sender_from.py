"""The sender is the sender in the mail itself: emails go out through a real worker and SMTP
mailer to a private Postfix, which delivers them into a Maildir, and each delivered From parses
back (``email.policy.default``) to exactly its sender's display name and address, with that
sender's signature in the body, however the name is spelled (a comma, a colon, non-ASCII)."""

from __future__ import annotations

import email
import email.policy
import time
from collections.abc import Iterator
from datetime import timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import cast

import pytest

from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.senders import Sender
from sendqueue.ports import SenderStore
from sendqueue.services.templates.render import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import LENIENT_LATENESS, T0, open_policy
from tests.support.mailservers import BOUNCE_DOMAIN, Dovecot, Postfix

pytestmark = pytest.mark.slow

NAMES = {
    "john@example.org": "Doe, John",
    "news@example.org": "News: Weekly",
    "zoe@example.org": "Zoë Ünal-Çelik",
}
TEMPLATES = Templates(
    subject="News from {{ sender.name }}",
    body="Hello {{ name }}\n-- \n{{ sender.signature }}\nReply to {{ sender.email }}\n",
    html="<p>Hello</p><p>{{ sender.signature }}</p>",
)


@pytest.fixture
def app(postfix: Postfix, tmp_path: Path) -> Iterator[tuple[Container, FakeClock, SqlTaskStore]]:
    clock = FakeClock(T0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    settings = Settings(_env_file=None, max_lateness=LENIENT_LATENESS, space_late_sends=False)
    mailer = SmtpMailer("127.0.0.1", postfix.port, security="none", timeout=10)
    scheduler = FakeScheduler(clock, seed=1)
    container = bootstrap(settings, clock=clock, store=store, scheduler=scheduler, mailer=mailer)
    try:
        yield container, clock, store
    finally:
        container.close()


def _delivered(dovecot: Dovecot, count: int, timeout: float = 30.0) -> list[EmailMessage]:
    """The messages Postfix delivered into the Maildir, once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted((dovecot.maildir / "new").iterdir())
        if len(files) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(files) == count
    return [email.message_from_bytes(p.read_bytes(), policy=email.policy.default) for p in files]


def _send_all(container: Container, clock: FakeClock, cid: str) -> None:
    container.provisioner.provision(cid)
    clock.advance(days=1)
    scheduler = container.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.fire_due(container.invoke)


def test_each_email_goes_out_from_its_sender_with_its_signature(
    app: tuple[Container, FakeClock, SqlTaskStore], dovecot: Dovecot
) -> None:
    container, clock, store = app
    senders = cast(SenderStore, store)
    ids = []
    for i, (address, name) in enumerate(NAMES.items()):
        sender = Sender(
            id=f"s00000000000{i}", email=address, name=name,
            signature_text=f"{name}\nline two of {i} & more",
            signature_html=f"<b>{i}</b>" if i == 0 else None,
        )  # fmt: skip
        senders.add_sender(sender)
        ids.append(sender.id)
    rows = "email,name\n" + "".join(f"r{i}@{BOUNCE_DOMAIN},R{i}\n" for i in range(6))
    cid = container.campaign_import.create(
        name="rotating", recipients=rows.encode(), policy=open_policy(T0), senders=ids,
        templates=TEMPLATES,
    ).campaign.id  # fmt: skip

    _send_all(container, clock, cid)

    tasks = store.list_tasks(cid, limit=100)
    assert {t.state for t in tasks} == {TaskState.FINISHED}
    by_message_id = {t.message_id: t for t in tasks}
    messages = _delivered(dovecot, 6)
    seen = set()
    for message in messages:
        task = by_message_id[message["Message-ID"]]
        (sender,) = message["From"].addresses
        assert sender.addr_spec == task.sender
        assert sender.display_name == NAMES[sender.addr_spec]
        assert str(message["Subject"]) == f"News from {sender.display_name}"
        text = message.get_body(("plain",))
        html = message.get_body(("html",))
        assert text is not None and html is not None
        index = list(NAMES).index(sender.addr_spec)
        signature = f"{sender.display_name}\nline two of {index} & more"
        assert f"-- \n{signature}\nReply to {sender.addr_spec}\n" in text.get_content()
        expected = (
            "<b>0</b>" if index == 0 else signature.replace("&", "&amp;").replace("\n", "<br>\n")
        )
        assert f"<p>{expected}</p>" in html.get_content()
        seen.add(sender.addr_spec)
    assert seen == set(NAMES)  # the senders took turns


@pytest.mark.parametrize(
    "from_addr", ['"Doe, John" <john@example.org>', "Zoë Ünal <z@example.org>"]
)
def test_a_campaign_without_senders_goes_out_from_its_from(
    app: tuple[Container, FakeClock, SqlTaskStore], dovecot: Dovecot, from_addr: str
) -> None:
    container, clock, _ = app
    rows = f"email\nr@{BOUNCE_DOMAIN}\n"
    cid = container.campaign_import.create(
        name="plain", recipients=rows.encode(), policy=open_policy(T0 + timedelta(hours=1)),
        from_addr=from_addr, templates=TEMPLATES,
    ).campaign.id  # fmt: skip

    _send_all(container, clock, cid)

    (message,) = _delivered(dovecot, 1)
    (sender,) = message["From"].addresses
    name, address = from_addr.rsplit(" <", 1)
    assert (sender.display_name, sender.addr_spec) == (name.strip('"'), address.rstrip(">"))
    text = message.get_body(("plain",))
    assert text is not None
    assert text.get_content().endswith(f"-- \n\nReply to {sender.addr_spec}\n")
