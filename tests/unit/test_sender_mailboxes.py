"""The senders' own mailboxes in the feedback poll, on in-memory parts: read as the store has
the senders at each pass, one cursor, lease and state each (named by the sender and the URL
without its password), and a failing one kept as its state, masked, while the others are read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.bootstrap.feedback import open_sender_mailbox
from sendqueue.domain.errors import FeedbackUnavailable, InvalidField
from sendqueue.domain.feedback import Feedback, MailboxState
from sendqueue.domain.senders import Sender
from sendqueue.ports import FeedbackMessage, FeedbackSource
from sendqueue.services.feedback.mailboxes import sender_mailbox_key
from sendqueue.services.feedback.poll import lease_name
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailbox import InMemoryMailbox
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0

URL_A = "imap://ann:secret-a@127.0.0.1:143/INBOX?security=none"
URL_B = "imap://bob:secret-b@127.0.0.1:143/INBOX?security=none"


class _RefusingMailbox(InMemoryMailbox):
    """A mailbox whose server refuses the login, quoting what it was sent (as some do)."""

    def fetch(
        self, after: tuple[int, int] | None, *, limit: int = 500
    ) -> tuple[int, Iterator[FeedbackMessage]]:
        raise FeedbackUnavailable(f"{self.name}: connecting failed: bad password secret-a")


def _where(url: str) -> str:
    """``user@host:port/folder`` of a test URL: its mailbox, whatever the password."""
    user = url.split("://", 1)[1].split(":", 1)[0]
    return f"{user}@{url.split('@', 1)[1].split('?', 1)[0]}"


class World:
    def __init__(self) -> None:
        self.boxes: dict[str, InMemoryMailbox] = {}
        self.seen: list[Feedback] = []
        clock = FakeClock(T0)
        self.app: Container = bootstrap(
            Settings(_env_file=None),
            clock=clock,
            store=InMemoryTaskStore(),
            scheduler=FakeScheduler(clock, seed=1),
            mailer=RecordingMailer(),
            parse_feedback=self._parse,
            open_mailbox=self._open,
        )

    def _parse(self, raw: bytes, **_: object) -> list[Feedback]:
        return []  # what is read is counted; applying feedback is the service's tests' part

    def _open(self, sender: Sender) -> FeedbackSource:
        assert sender.imap is not None
        if "bad" in sender.imap:
            raise InvalidField("imap", "imap://ann:***@", "expected imap:// or imaps://")
        return self.boxes[_where(sender.imap)]

    def box(self, url: str, *, refusing: bool = False) -> InMemoryMailbox:
        kind = _RefusingMailbox if refusing else InMemoryMailbox
        box = self.boxes[_where(url)] = kind(f"imap://{_where(url)}")
        return box

    def sender(self, sid: str, email: str, imap: str | None) -> Sender:
        sender = Sender(id=sid, email=email, imap=imap)
        self.app.sender_store.add_sender(sender)
        return sender

    def state(self, sender: Sender) -> MailboxState:
        return self.app.mailboxes.states_of([sender])[sender.id]


@pytest.fixture
def world() -> World:
    return World()


def test_each_pass_reads_the_senders_mailboxes_as_the_store_has_them(world: World) -> None:
    poller = world.app.feedback_poller
    assert poller.configured and poller.poll().mailboxes == 0
    box = world.box(URL_A)
    box.add(b"a reply")
    ann = world.sender("s00000000000a", "ann@example.com", URL_A)
    world.sender("s00000000000c", "no-box@example.com", None)  # no mailbox: nothing read
    assert world.state(ann) == MailboxState(box.name, None, 0, None)  # never polled yet

    report = poller.poll()
    assert (report.mailboxes, report.messages, report.errors) == (1, 1, [])
    key = sender_mailbox_key(ann.id, box.name)
    assert world.app.store.feedback_cursor(key) == (1, 1)
    assert world.state(ann) == MailboxState(box.name, T0, 1, None)
    box.add(b"another")
    poller.poll()
    assert world.state(ann).messages_read == 2  # cumulative

    world.app.sender_store.remove_sender(ann.id)
    fetches = box.fetches
    assert poller.poll().mailboxes == 0
    assert box.fetches == fetches


def test_a_failing_mailbox_is_kept_masked_and_the_others_are_still_read(world: World) -> None:
    world.box(URL_A, refusing=True)
    good = world.box(URL_B)
    good.add(b"a reply")
    ann = world.sender("s00000000000a", "ann@example.com", URL_A)
    bob = world.sender("s00000000000b", "bob@example.com", URL_B)
    bad = world.sender("s00000000000d", "dee@example.com", "imap://dee:pw@bad")

    report = world.app.feedback_poller.poll()
    assert (report.mailboxes, report.messages) == (2, 1)  # bob's read past the failing two
    assert len(report.errors) == 2
    assert not any("secret-a" in e for e in report.errors)
    state = world.state(ann)
    assert state.last_error == (
        "imap://ann@127.0.0.1:143/INBOX: connecting failed: bad password ***"
    )
    assert (state.polled_at, state.messages_read) == (T0, 0)
    assert world.state(bad).last_error == "imap: expected imap:// or imaps://"
    assert world.state(bob) == MailboxState("imap://bob@127.0.0.1:143/INBOX", T0, 1, None)

    # A new password: the same cursor and state, and the error cleared by a pass that worked.
    world.box(URL_A)
    world.app.sender_store.update_sender(replace(ann, imap=URL_A.replace("secret-a", "new")))
    assert world.app.feedback_poller.poll().errors == [
        f"{sender_mailbox_key(bad.id, None)}: imap: expected imap:// or imaps://"
    ]
    assert world.state(ann) == MailboxState("imap://ann@127.0.0.1:143/INBOX", T0, 0, None)


def test_a_mailbox_another_poller_reads_is_skipped_and_its_state_left(world: World) -> None:
    box = world.box(URL_A)
    box.add(b"a reply")
    ann = world.sender("s00000000000a", "ann@example.com", URL_A)
    key = lease_name(sender_mailbox_key(ann.id, box.name))
    assert world.app.store.acquire_lease(key, "other", ttl_seconds=300, at=T0)
    report = world.app.feedback_poller.poll()
    assert report.busy == [sender_mailbox_key(ann.id, box.name)] and report.messages == 0
    assert world.state(ann).polled_at is None


def test_a_mailbox_is_named_by_its_sender_and_its_url_without_the_password(world: World) -> None:
    def key(url: str, sid: str = "s00000000000a") -> str:
        source = open_sender_mailbox(world.app, Sender(id=sid, email="ann@example.com", imap=url))
        return sender_mailbox_key(sid, source.name)

    base = key("imaps://ann:one@mail.example.com/INBOX")
    assert base == "sender:s00000000000a:imap://ann@mail.example.com:993/INBOX"
    assert key("imaps://ann:two@mail.example.com/INBOX?timeout=5") == base  # a new password
    assert key("imaps://ann2:one@mail.example.com/INBOX") != base  # another user
    assert key("imaps://ann:one@mx.example.com/INBOX") != base  # another host
    assert key("imaps://ann:one@mail.example.com/Replies") != base  # another folder
    assert key("imaps://ann:one@mail.example.com/INBOX", "s00000000000b") != base
    bad = Sender(id="s00000000000a", email="a@example.com", imap="pop3://x")
    with pytest.raises(InvalidField) as refused:
        open_sender_mailbox(world.app, bad)
    assert refused.value.field == "imap"
