"""The FeedbackSource contract (sendqueue.ports.FeedbackSource), run against the in-memory
mailbox and the IMAP source on a real Dovecot: messages after the cursor in UID order, at most
``limit``, handed over one at a time by an iterator that the next fetch or close ends and that
may be dropped half-way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest

from sendqueue.adapters.imap import ImapFeedbackSource
from sendqueue.domain.errors import FeedbackUnavailable
from sendqueue.ports import FeedbackSource
from sendqueue.testing.mailbox import InMemoryMailbox


@dataclass
class Mailbox:
    source: FeedbackSource
    add: Callable[[bytes], object]


def _raw(n: int) -> bytes:
    return f"From: a{n}@example.org\r\nSubject: message {n}\r\n\r\nbody {n}\r\n".encode()


@pytest.fixture(params=["memory", "imap"])
def mailbox(request: pytest.FixtureRequest) -> Iterator[Mailbox]:
    if request.param == "memory":
        box = InMemoryMailbox()
        yield Mailbox(box, box.add)
        return
    dovecot = request.getfixturevalue("dovecot")
    source = ImapFeedbackSource.from_url(dovecot.url)

    def append(raw: bytes) -> None:
        client = cast(Any, dovecot.client())
        try:
            client.append("INBOX", raw)
        finally:
            client.logout()

    try:
        yield Mailbox(source, append)
    finally:
        source.close()


def _fill(mailbox: Mailbox, count: int) -> None:
    for n in range(count):
        mailbox.add(_raw(n))


def test_messages_after_the_cursor_in_uid_order_at_most_limit(mailbox: Mailbox) -> None:
    _fill(mailbox, 5)
    source = mailbox.source
    uidvalidity, batch = source.fetch(None, limit=3)
    first = list(batch)
    assert [m.raw for m in first] == [_raw(n) for n in range(3)]
    uids = [m.uid for m in first]
    assert uids == sorted(uids)
    assert all(m.key == f"{source.name}:{uidvalidity}:{m.uid}" for m in first)
    same, batch = source.fetch((uidvalidity, uids[-1]), limit=3)
    assert same == uidvalidity
    assert [m.raw for m in batch] == [_raw(3), _raw(4)]
    rest = source.fetch((uidvalidity, uids[-1] + 100))[1]
    assert list(rest) == []
    # another UIDVALIDITY: everything again
    assert len(list(source.fetch((uidvalidity + 1, 10**6))[1])) == 5


def test_the_next_fetch_or_close_ends_an_iterator(mailbox: Mailbox) -> None:
    _fill(mailbox, 3)
    source = mailbox.source
    uidvalidity, older = source.fetch(None, limit=1)
    _, newer = source.fetch(None)
    with pytest.raises(FeedbackUnavailable):
        list(older)
    assert next(newer).raw == _raw(0)
    source.close()
    with pytest.raises(FeedbackUnavailable):
        list(newer)
    assert len(list(source.fetch((uidvalidity, 0))[1])) == 3  # the source works again


def test_an_iterator_dropped_half_way_leaves_the_source_usable(mailbox: Mailbox) -> None:
    _fill(mailbox, 4)
    source = mailbox.source
    _, messages = source.fetch(None)
    assert next(messages).raw == _raw(0)
    del messages
    _, again = source.fetch(None)
    assert [m.raw for m in again] == [_raw(n) for n in range(4)]
