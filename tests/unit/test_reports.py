"""Feedback from received messages (issue 14): DSNs, ARF complaints, replies, auto-replies and
unsubscribes by mail, from fixture messages written after the RFCs and typical MTAs
(tests/data/feedback), and hypothesis properties of the parser."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.reports import parse_feedback

DATA = Path(__file__).resolve().parents[1] / "data" / "feedback"
#: The secret key and bounce address the fixtures' VERP addresses and tokens were made with.
SECRET = "feedback-fixtures-secret-0123456789abcdef"
BOUNCES = "bounces@mail.example.net"
RECEIVED = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

H, S, C, R, U = (
    FeedbackKind.HARD_BOUNCE,
    FeedbackKind.SOFT_BOUNCE,
    FeedbackKind.COMPLAINT,
    FeedbackKind.REPLY,
    FeedbackKind.UNSUBSCRIBE,
)


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


def parse(raw: bytes, *, verp: bool = True, key: str | None = "inbox:7:42") -> list[Feedback]:
    if verp:
        return parse_feedback(
            raw, received_at=RECEIVED, key=key, bounce_address=BOUNCES, secret=SECRET
        )
    return parse_feedback(raw, received_at=RECEIVED, key=key)


def test_a_postfix_dsn_is_a_hard_bounce_of_the_verp_task_with_status_and_diagnostic() -> None:
    (item,) = parse(fixture("postfix-hard-bounce.eml"))
    assert item.kind is H
    assert item.task_id == "c0a1b2c3d4e5f-1"
    assert item.recipient == "nobody@example.org"
    assert item.detail == (
        "5.1.1 smtp; 550 5.1.1 <nobody@example.org>: Recipient address rejected: "
        "User unknown in local recipient table"
    )
    assert item.key == "inbox:7:42"
    assert item.at == datetime(2026, 12, 1, 10, 15, 1, tzinfo=UTC)  # its Arrival-Date


def test_without_verp_settings_the_returned_headers_name_the_task() -> None:
    (item,) = parse(fixture("postfix-hard-bounce.eml"), verp=False)
    assert (item.kind, item.task_id, item.recipient) == (H, "c0a1b2c3d4e5f-1", "nobody@example.org")


def test_a_reply_names_the_task_of_the_message_it_answers() -> None:
    (item,) = parse(fixture("reply-thunderbird.eml"))
    assert (item.kind, item.task_id, item.recipient) == (R, "c0a1b2c3d4e5f-2", "anna@example.org")
    assert item.detail == "Re: Your December offers"
    assert item.at == RECEIVED


@pytest.mark.parametrize("raw", [b"", b"\x00\xff garbage", b"Subject: hi\n\nno sender\n"])
def test_what_is_no_feedback_gives_nothing(raw: bytes) -> None:
    assert parse(raw) == []


def test_a_naive_time_or_a_short_secret_is_a_configuration_error() -> None:
    with pytest.raises(InvalidField) as naive:
        parse_feedback(b"", received_at=datetime(2026, 12, 2))
    assert naive.value.field == "received_at"
    with pytest.raises(InvalidField) as short:
        parse_feedback(b"", received_at=RECEIVED, secret="short")
    assert short.value.field == "secret_key"
