"""The IMAP feedback source against a real Dovecot: UIDVALIDITY and UID order, batches, the
cursor, read-only access (no flag set, nothing moved), and every failure as
FeedbackUnavailable with no password in it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from sendqueue.adapters.imap import ImapFeedbackSource
from sendqueue.domain.errors import FeedbackUnavailable
from tests.support.mailservers import Dovecot, free_port


def _message(n: int) -> bytes:
    return (
        f"From: someone{n}@example.org\r\nTo: bounces@example.com\r\n"
        f"Subject: message {n}\r\nMessage-ID: <m{n}@example.org>\r\n\r\nbody {n}\r\n"
    ).encode()


def _client(dovecot: Dovecot) -> Any:
    return cast(Any, dovecot.client())


def _append(dovecot: Dovecot, count: int, start: int = 0) -> None:
    client = _client(dovecot)
    try:
        for n in range(start, start + count):
            client.append("INBOX", _message(n))
    finally:
        client.logout()


def _flags(dovecot: Dovecot) -> dict[int, tuple[bytes, ...]]:
    client = _client(dovecot)
    try:
        client.select_folder("INBOX", readonly=True)
        fetched = client.fetch("1:*", ["FLAGS"])
        return {uid: tuple(sorted(data[b"FLAGS"])) for uid, data in fetched.items()}
    finally:
        client.logout()


def test_fetch_reads_every_message_after_the_cursor_in_batches_and_changes_nothing(
    dovecot: Dovecot,
) -> None:
    _append(dovecot, 5)
    dovecot.deliver(_message(5))  # one delivered the Maildir way, as Postfix does
    before = _flags(dovecot)
    source = ImapFeedbackSource.from_url(dovecot.url)
    try:
        uidvalidity, batch = source.fetch(None, limit=4)
        first = list(batch)
        assert [m.uid for m in first] == [1, 2, 3, 4]
        assert b"Subject: message 0" in first[0].raw
        assert first[0].key == f"{source.name}:{uidvalidity}:1"
        same, batch = source.fetch((uidvalidity, 4), limit=4)
        rest = list(batch)
        assert same == uidvalidity
        assert [m.uid for m in rest] == [5, 6]
        assert b"Subject: message 5" in rest[-1].raw
        # nothing after the last: "7:*" matches the highest UID on the server, which is skipped
        assert list(source.fetch((uidvalidity, 6))[1]) == []
        # another UIDVALIDITY: the mailbox was re-created, everything is new
        assert [m.uid for m in source.fetch((uidvalidity + 1, 6))[1]] == [1, 2, 3, 4, 5, 6]
    finally:
        source.close()
    after = _flags(dovecot)
    assert after == before
    assert all(b"\\Seen" not in flags for flags in after.values())
    assert (
        len(list((dovecot.maildir / "new").iterdir()))
        + len(list((dovecot.maildir / "cur").iterdir()))
        == 6
    )


def test_the_name_and_repr_hold_no_password(dovecot: Dovecot) -> None:
    source = ImapFeedbackSource.from_url(dovecot.url)
    assert source.name == f"imap://bounces@127.0.0.1:{dovecot.port}/INBOX"
    assert dovecot.password not in repr(source)
    assert dovecot.password not in source.name


def test_a_wrong_password_is_feedback_unavailable_without_the_password(dovecot: Dovecot) -> None:
    url = dovecot.url.replace(dovecot.password, "wrong-secret-123")
    source = ImapFeedbackSource.from_url(url)
    with pytest.raises(FeedbackUnavailable) as info:
        source.fetch(None)
    assert "wrong-secret-123" not in str(info.value)
    assert source.name in str(info.value)
    assert "connecting failed" in str(info.value)


def test_a_missing_folder_is_feedback_unavailable(dovecot: Dovecot) -> None:
    source = ImapFeedbackSource.from_url(dovecot.url.replace("/INBOX", "/Nowhere"))
    with pytest.raises(FeedbackUnavailable, match="opening Nowhere failed"):
        source.fetch(None)


def test_an_unreachable_server_is_feedback_unavailable() -> None:
    port = free_port()
    source = ImapFeedbackSource.from_url(
        f"imap://u:very-secret@127.0.0.1:{port}/INBOX?security=none&timeout=2"
    )
    with pytest.raises(FeedbackUnavailable) as info:
        source.fetch(None)
    assert "ConnectionRefusedError" in str(info.value)
    assert "very-secret" not in str(info.value)


def test_starttls_refused_by_a_server_without_it_is_feedback_unavailable(
    dovecot: Dovecot,
) -> None:
    # ssl = no: the server offers no STARTTLS, and the password must not go out in clear
    source = ImapFeedbackSource.from_url(dovecot.url.replace("security=none", "security=starttls"))
    with pytest.raises(FeedbackUnavailable, match="connecting failed"):
        source.fetch(None)


def test_a_dropped_connection_is_reopened_by_the_next_fetch(dovecot: Dovecot) -> None:
    _append(dovecot, 2)
    source = ImapFeedbackSource.from_url(dovecot.url)
    try:
        uidvalidity, messages = source.fetch(None)
        assert len(list(messages)) == 2
        cast(Any, source)._client.shutdown()  # the server or the network dropped it
        with pytest.raises(FeedbackUnavailable):
            source.fetch((uidvalidity, 2))
        _append(dovecot, 1, start=2)
        assert [m.uid for m in source.fetch((uidvalidity, 2))[1]] == [3]
    finally:
        source.close()


def test_a_huge_message_is_read_only_to_a_bound(dovecot: Dovecot) -> None:
    # Red team: the senders' mailboxes hold replies with attachments of tens of megabytes; a
    # batch of 100 of them fetched whole would hold gigabytes. Feedback needs the first part
    # of a message only (headers, the report parts): the source reads each to a bound.
    attachment = b"A" * 76 + b"\r\n"
    big = _message(0).replace(b"body 0\r\n", b"Hi, see the attachment.\r\n" + attachment * 200_000)
    assert len(big) > 15_000_000
    client = _client(dovecot)
    try:
        client.append("INBOX", big)
    finally:
        client.logout()
    source = ImapFeedbackSource.from_url(dovecot.url)
    try:
        _, [message] = source.fetch(None)
    finally:
        source.close()
    assert len(message.raw) <= 2 * 1024 * 1024  # not the 15 MB
    assert message.raw == big[: len(message.raw)]  # the start, headers first
    from sendqueue.adapters.imap.source import MAX_MESSAGE_BYTES

    assert len(message.raw) == MAX_MESSAGE_BYTES


def test_bodies_are_read_as_the_iterator_goes_in_fetches_bounded_by_bytes(
    dovecot: Dovecot,
) -> None:
    # Red team: a batch of 200 messages of 1 MiB was fetched 100 at a time and handed over as
    # one list. Now the sizes come first, then the bodies a few MiB per FETCH, each message
    # handed over as the caller asks for it.
    from sendqueue.adapters.imap.source import FETCH_BYTES, MAX_MESSAGE_BYTES

    line = b"B" * 76 + b"\r\n"
    big = _message(0).replace(b"body 0\r\n", line * (3 * MAX_MESSAGE_BYTES // 2 // len(line)))
    client = _client(dovecot)
    try:
        for _ in range(10):
            client.append("INBOX", big)  # each read to MAX_MESSAGE_BYTES
        for n in range(3):
            client.append("INBOX", _message(n))
    finally:
        client.logout()
    source = ImapFeedbackSource.from_url(dovecot.url)
    named: list[list[int]] = []
    try:
        uidvalidity, messages = source.fetch(None)
        imap = cast(Any, source)._client
        fetch = imap.fetch

        def noting(uids: list[int], items: list[str]) -> Any:
            named.append(list(uids))
            return fetch(uids, items)

        imap.fetch = noting
        first = next(messages)
        assert (first.uid, len(first.raw)) == (1, MAX_MESSAGE_BYTES)
        assert named == [[1, 2, 3, 4]]  # one FETCH so far, of FETCH_BYTES
        rest = list(messages)
    finally:
        source.close()
    assert FETCH_BYTES == 4 * MAX_MESSAGE_BYTES
    assert named == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12, 13]]
    assert [m.uid for m in rest] == list(range(2, 14))
    assert all(m.uidvalidity == uidvalidity for m in rest)
    assert rest[-1].raw == _message(2)


def test_an_iterator_ends_at_a_dropped_connection_and_the_next_fetch_reconnects(
    dovecot: Dovecot,
) -> None:
    _append(dovecot, 3)
    source = ImapFeedbackSource.from_url(dovecot.url)
    try:
        uidvalidity, messages = source.fetch(None, limit=2)
        cast(Any, source)._client.shutdown()  # the server or the network dropped it
        with pytest.raises(FeedbackUnavailable, match="fetching failed"):
            next(messages)
        assert [m.uid for m in source.fetch((uidvalidity, 1))[1]] == [2, 3]
    finally:
        source.close()


def test_the_probe_signs_in_opens_the_folder_and_changes_nothing(dovecot: Dovecot) -> None:
    _append(dovecot, 2)
    before = _flags(dovecot)
    source = ImapFeedbackSource.from_url(dovecot.url)
    assert source.probe(5) == f"{source.name}: signed in, 2 messages in INBOX"
    assert _flags(dovecot) == before  # not even \Seen
    missing = ImapFeedbackSource.from_url(dovecot.url.replace("/INBOX", "/Nowhere"))
    with pytest.raises(FeedbackUnavailable, match="opening Nowhere failed"):
        missing.probe(5)
    wrong = ImapFeedbackSource.from_url(dovecot.url.replace(dovecot.password, "wrong-pw-456"))
    with pytest.raises(FeedbackUnavailable, match="signing in failed") as info:
        wrong.probe(5)
    assert "wrong-pw-456" not in str(info.value)
