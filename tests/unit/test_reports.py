"""Feedback from received messages (issue 14): DSNs, plain-text bounces, ARF complaints,
replies, auto-replies and unsubscribes by mail, from fixture messages written after the RFCs
and typical MTAs (tests/data/feedback), and hypothesis properties of the parser."""

from __future__ import annotations

import base64
import quopri
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.feedback import Feedback, FeedbackKind, Proof
from sendqueue.domain.reports import MAX_ITEMS, parse_feedback
from sendqueue.domain.tokens import TokenPurpose, sign_task, verp_address

DATA = Path(__file__).resolve().parents[1] / "data" / "feedback"
#: The secret key and bounce address the fixtures' VERP addresses and tokens were made with.
SECRET = "feedback-fixtures-secret-0123456789abcdef"
BOUNCES = "bounces@mail.example.net"
RECEIVED = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
FIXTURES = sorted(p.name for p in DATA.glob("*.eml"))

H, S, C, R, U, A = (
    FeedbackKind.HARD_BOUNCE,
    FeedbackKind.SOFT_BOUNCE,
    FeedbackKind.COMPLAINT,
    FeedbackKind.REPLY,
    FeedbackKind.UNSUBSCRIBE,
    FeedbackKind.AUTO_REPLY,
)
T = "c0a1b2c3d4e5f-"  # the fixtures' campaign


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


def parse(
    raw: bytes, *, verp: bool = True, keyed: bool = True, key: str | None = "inbox:7:42"
) -> list[Feedback]:
    """Parse as sendqueue does: with the bounce address and the key (``verp``), with the key
    but no bounce address, or (``keyed=False``) with neither."""
    if not keyed:
        return parse_feedback(raw, received_at=RECEIVED, key=key)
    bounces = BOUNCES if verp else None
    return parse_feedback(raw, received_at=RECEIVED, key=key, bounce_address=bounces, secret=SECRET)


def summary(items: list[Feedback]) -> list[tuple[FeedbackKind, str | None, str | None]]:
    return [(i.kind, i.task_id, i.recipient) for i in items]


def mid(task_id: str) -> str:
    """The left part of the Message-ID sendqueue gives ``task_id``'s email (signed)."""
    return sign_task(task_id, SECRET, TokenPurpose.MESSAGE_ID)


_SIGNED_ID = re.compile(rb"(c0a1b2c3d4e5f-[0-9]+)\.[0-9a-f]{32}@")


def unsigned(raw: bytes) -> bytes:
    """``raw`` with every signed Message-ID of the fixtures' campaign written unsigned, as an
    outsider who guessed the ids would write them."""
    return _SIGNED_ID.sub(rb"\1@", raw)


# --- the fixture messages -----------------------------------------------------------------

EXPECTED: dict[str, list[tuple[FeedbackKind, str | None, str | None]]] = {
    # RFC 3464 reports
    "postfix-hard-bounce.eml": [(H, T + "1", "nobody@example.org")],
    "postfix-delayed.eml": [(S, T + "2", "slow@example.com")],
    "exchange-ndr.eml": [(H, T + "4", "m.mustermann@contoso.example")],
    "gmail-bounce.eml": [(H, T + "5", "no.such.user.4711@gmail.com")],
    "sendmail-multi-recipient.eml": [],  # its returned headers name no email of ours
    "dsn-delivered.eml": [],
    # plain-text bounces
    "exim-hard-bounce.eml": [(H, T + "3", "gone@example.de")],
    "exim-delayed.eml": [(S, T + "11", "busy@example.at")],
    "qmail-bounce.eml": [(H, T + "12", "nosuch@example.info")],
    # RFC 5965 complaints
    "yahoo-arf.eml": [(C, T + "6", "annoyed.reader@yahoo.example")],
    "aol-arf.eml": [(C, T + "13", None)],  # recipient redacted; the returned header names it
    "hotmail-jmrp.eml": [(C, T + "14", "reader@hotmail.example")],
    "arf-not-spam.eml": [],
    # replies and what is none
    "reply-thunderbird.eml": [(R, T + "2", "anna@example.org")],
    "reply-outlook.eml": [(R, T + "9", "Marie.Dupont@Example.FR")],
    "reply-no-headers.eml": [(R, None, "ola@example.no")],
    "reply-to-other.eml": [],
    # out-of-office notices: an auto-reply with its return date, never a reply
    "exchange-oof.eml": [(A, T + "7", "jan@fabrikam.example")],
    "oof-german-subject-only.eml": [(A, T + "8", "juergen@example.de")],
    "oof-gmail-vacation.eml": [(A, T + "15", "tom.baker@gmail.example")],
    "oof-x-autoreply.eml": [(A, T + "16", "lena@example.net")],
    "oof-outlook-german-html.eml": [(A, T + "17", "p.schulz@contoso.example")],
    "oof-no-date.eml": [],  # no date to wait for: nothing
    "list-digest-with-date.eml": [],  # list mail: no auto-reply
    "mdn-read-receipt.eml": [],
    "mailer-daemon-notice.eml": [],
    "unsubscribe-mailto.eml": [(U, T + "5", "reader@example.net")],
}


#: How each fixture proves its task (its returned message's or its reply's signed Message-ID,
#: the fixtures' Message-IDs being signed with SECRET, or its VERP address).
PROOF = {
    "postfix-hard-bounce.eml": Proof.VERP,
    "postfix-delayed.eml": Proof.VERP,
    "exchange-ndr.eml": Proof.VERP,
    "gmail-bounce.eml": Proof.VERP,
    "exim-hard-bounce.eml": Proof.VERP,
    "exim-delayed.eml": Proof.SIGNED,
    "qmail-bounce.eml": Proof.SIGNED,
    "yahoo-arf.eml": Proof.VERP,
    "aol-arf.eml": Proof.SIGNED,
    "hotmail-jmrp.eml": Proof.SIGNED,
    "reply-thunderbird.eml": Proof.SIGNED,
    "reply-outlook.eml": Proof.SIGNED,
    "reply-no-headers.eml": Proof.NONE,  # a From header alone proves nothing
    "unsubscribe-mailto.eml": Proof.SIGNED,
    "exchange-oof.eml": Proof.SIGNED,
    "oof-german-subject-only.eml": Proof.SIGNED,
    "oof-gmail-vacation.eml": Proof.SIGNED,
    "oof-x-autoreply.eml": Proof.SIGNED,
    "oof-outlook-german-html.eml": Proof.SIGNED,
}

#: The return date each out-of-office fixture names (its feedback's detail); RECEIVED is
#: 2 December 2026, so "4 January" is in 2027.
RETURN_DATES = {
    "exchange-oof.eml": "2027-01-04",
    "oof-german-subject-only.eml": "2027-01-04",
    "oof-gmail-vacation.eml": "2026-12-14",
    "oof-x-autoreply.eml": "2026-12-14",
    "oof-outlook-german-html.eml": "2026-12-12",  # "bis einschließlich 11.12.": the day after
}


@pytest.mark.parametrize("name", sorted(RETURN_DATES))
def test_an_out_of_office_notice_gives_its_return_date(name: str) -> None:
    (item,) = parse(fixture(name))
    assert (item.kind, item.detail) == (A, RETURN_DATES[name])
    assert item.kind.outcome is None and item.kind.suppression is None


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(EXPECTED) == FIXTURES


@pytest.mark.parametrize("name", FIXTURES)
def test_each_fixture_gives_its_feedback(name: str) -> None:
    items = parse(fixture(name))
    assert summary(items) == EXPECTED[name]
    assert {i.proof for i in items} <= {PROOF.get(name)}


@pytest.mark.parametrize("name", FIXTURES)
def test_without_verp_the_signed_message_id_names_the_task(name: str) -> None:
    items = parse(fixture(name), verp=False)
    assert summary(items) == EXPECTED[name]
    assert {i.proof for i in items} <= {Proof.SIGNED, Proof.NONE}


@pytest.mark.parametrize("name", FIXTURES)
def test_without_the_key_no_report_and_no_reply_proves_anything(name: str) -> None:
    # Task ids and unsigned Message-IDs are guessable: nothing can be checked without the key.
    items = parse(fixture(name), keyed=False)
    assert all(i.kind in (R, A) and i.task_id is None and i.proof is Proof.NONE for i in items)
    replies = [(k, None, r) for k, _, r in EXPECTED[name] if k in (R, A)]
    assert summary(items) == replies


def test_a_postfix_dsn_carries_status_diagnostic_arrival_date_and_key() -> None:
    (item,) = parse(fixture("postfix-hard-bounce.eml"))
    assert item.detail == (
        "5.1.1 smtp; 550 5.1.1 <nobody@example.org>: Recipient address rejected: "
        "User unknown in local recipient table"
    )
    assert item.key == "inbox:7:42"
    assert item.at == datetime(2026, 12, 1, 10, 15, 1, tzinfo=UTC)  # its Arrival-Date


def test_a_gmail_dsn_is_dated_by_its_last_attempt_and_unfolds_the_diagnostic() -> None:
    (item,) = parse(fixture("gmail-bounce.eml"))
    assert item.at == datetime(2026, 12, 1, 10, 41, 7, tzinfo=UTC)  # -0800 converted
    assert item.detail.startswith("5.1.1 smtp; 550-5.1.1 The email account that you tried")
    assert "\n" not in item.detail
    assert item.detail.endswith("- gsmtp")


def test_an_exchange_ndr_keeps_its_three_digit_status_detail() -> None:
    (item,) = parse(fixture("exchange-ndr.eml"))
    assert item.detail.startswith("5.1.10 smtp;550 5.1.10 RESOLVER.ADR.RecipientNotFound")


def _ours(raw: bytes, task: str = T + "1") -> bytes:
    """``raw`` with its returned headers' Message-ID made one sendqueue signed for ``task``."""
    signed = f"<{sign_task(task, SECRET, TokenPurpose.MESSAGE_ID)}@shop.example.com>"
    return raw.replace(b"<someone-else-made-this@mail.example.net>", signed.encode())


def test_a_multi_recipient_report_numbers_the_keys_and_dates_each_block() -> None:
    items = parse(_ours(fixture("sendmail-multi-recipient.eml")), verp=False)
    # the report proves its email; the service applies only the block of that email's address
    assert {(i.task_id, i.proof) for i in items} == {(T + "1", Proof.SIGNED)}
    assert [i.recipient for i in items] == [
        "alice@example.edu",
        "carol@example.edu",
        "dave@example.edu",
    ]
    assert [i.key for i in items] == ["inbox:7:42#1", "inbox:7:42#2", "inbox:7:42#3"]
    assert [i.detail for i in items] == [
        "5.2.2 SMTP; 550 5.2.2 Mailbox full",
        "5.1.1 SMTP; 550 5.1.1 User unknown",
        "4.2.2",
    ]
    # Last-Attempt-Date where a block has one, else the report's Arrival-Date (-0500)
    assert [i.at.isoformat() for i in items] == [
        "2026-12-01T14:10:11+00:00",
        "2026-12-01T14:10:11+00:00",
        "2026-12-01T14:10:10+00:00",
    ]
    assert [
        i.key for i in parse(_ours(fixture("sendmail-multi-recipient.eml")), key=None, verp=False)
    ] == [None] * 3


def test_plain_text_bounces_read_the_code_after_the_address() -> None:
    (exim,) = parse(fixture("exim-hard-bounce.eml"))
    assert exim.detail.startswith("5.1.1 SMTP error from remote mail server after RCPT TO:")
    assert exim.detail.endswith("User unknown in virtual mailbox table")
    (delayed,) = parse(fixture("exim-delayed.eml"), verp=False)
    assert delayed.detail == (
        "4.7.1 host mx.example.at [203.0.113.44]: 451 4.7.1 Greylisted, please try again later"
    )
    (qmail,) = parse(fixture("qmail-bounce.eml"), verp=False)
    assert qmail.detail == "5.1.1 Sorry, no mailbox here by that name. (#5.1.1)"
    assert qmail.at == RECEIVED  # its Date is "-0000": no known offset


def test_complaints_say_the_feedback_type_and_date_of_arrival() -> None:
    (yahoo,) = parse(fixture("yahoo-arf.eml"))
    assert (yahoo.detail, yahoo.at) == ("abuse", datetime(2026, 12, 1, 10, 50, tzinfo=UTC))
    (jmrp,) = parse(fixture("hotmail-jmrp.eml"), verp=False)
    assert jmrp.at == datetime(2026, 12, 1, 19, 5, 10, tzinfo=UTC)


@pytest.mark.parametrize("kind", ["fraud", "virus", "other", "opt-out"])
def test_every_feedback_type_but_not_spam_is_a_complaint(kind: str) -> None:
    raw = fixture("yahoo-arf.eml").replace(
        b"Feedback-Type: abuse", f"Feedback-Type: {kind}".encode()
    )
    assert [(i.kind, i.detail) for i in parse(raw)] == [(C, kind)]
    auth = fixture("yahoo-arf.eml").replace(b"Feedback-Type: abuse", b"Feedback-Type: auth-failure")
    assert parse(auth) == []


def test_replies_carry_the_decoded_subject_and_the_time_received() -> None:
    (item,) = parse(fixture("reply-outlook.eml"))
    assert item.detail == "RE: Your December offers \u2013 question"
    assert item.at == RECEIVED


# --- the task: a signed VERP address first, the returned message second -------------------

_POSTFIX = fixture("postfix-hard-bounce.eml")
_CUT = _POSTFIX[
    : _POSTFIX.index(b"--4Fh2X31xYzq.1796120103/mail.example.net\nContent-Description: Undelivered")
]


def test_a_verp_address_names_the_task_when_the_returned_headers_are_cut() -> None:
    assert summary(parse(_CUT)) == [(H, T + "1", "nobody@example.org")]
    assert summary(parse(_CUT, verp=False)) == []  # without VERP, nothing left proves the email


def test_the_verp_address_wins_over_the_returned_headers() -> None:
    other = _POSTFIX.replace(
        b"X-Sendqueue-Task: c0a1b2c3d4e5f-1", b"X-Sendqueue-Task: c0a1b2c3d4e5f-99"
    )
    other = other.replace(mid(T + "1").encode(), mid(T + "99").encode())
    other = re.sub(rb"List-Unsubscribe: [^\n]*\n", b"", other)
    assert summary(parse(other)) == [(H, T + "1", "nobody@example.org")]
    assert summary(parse(other, verp=False)) == [(H, T + "99", "nobody@example.org")]


def test_an_unsigned_or_altered_message_id_in_the_returned_headers_proves_nothing() -> None:
    no_link = re.sub(rb"List-Unsubscribe: [^\n]*\n", b"", _POSTFIX)
    signed = mid(T + "1").encode()
    altered = no_link.replace(signed, signed[:-1] + (b"0" if signed[-1:] != b"0" else b"1"))
    for raw in (unsigned(no_link), altered):
        assert parse(raw, verp=False) == []
    assert summary(parse(no_link, verp=False)) == [(H, T + "1", "nobody@example.org")]


def test_a_forged_or_foreign_verp_address_names_no_task() -> None:
    # With VERP set up, a report naming no genuine VERP address is not believed at all.
    forged = _CUT.replace(b"0839bbb0683ad4fd73f5de68a6f7d31c", b"0839bbb0683ad4fd73f5de68a6f7d31d")
    assert summary(parse(forged)) == []
    unsubscribe_token = sign_task(T + "1", SECRET, TokenPurpose.UNSUBSCRIBE)
    wrong_purpose = _CUT.replace(
        b"c0a1b2c3d4e5f-1.0839bbb0683ad4fd73f5de68a6f7d31c", unsubscribe_token.encode()
    )
    assert summary(parse(wrong_purpose)) == []


def test_a_forged_unsubscribe_token_changes_nothing() -> None:
    raw = fixture("unsubscribe-mailto.eml")
    assert parse(raw.replace(b"0e02d43609b6", b"0e02d43609b7")) == []
    human = raw.replace(
        b"Subject: unsubscribe c0a1b2c3d4e5f-5.0e02d43609b60944303c91d6f02a5b4a",
        b"Subject: unsubscribe please",
    )
    assert summary(parse(human)) == [(R, None, "reader@example.net")]


def test_a_report_date_after_receipt_is_not_believed() -> None:
    late = _POSTFIX.replace(b"Arrival-Date: Tue,  1 Dec 2026", b"Arrival-Date: Tue,  1 Dec 2099")
    (item,) = parse(late)
    assert item.at == RECEIVED


# --- auto-replies and mail systems are no replies ------------------------------------------

_REPLY = fixture("reply-thunderbird.eml")


def _with_header(raw: bytes, line: str) -> bytes:
    return line.encode() + b"\n" + raw


@pytest.mark.parametrize(
    "line",
    [
        "Auto-Submitted: auto-replied",
        "Auto-Submitted: auto-generated (vacation)",
        "X-Autoreply: yes",
        "X-Autorespond: Jan is away",
        "X-Autoresponder: on",
        "X-Autogenerated: Reply",
        "Precedence: auto_reply",
        "Precedence: bulk",
        "Precedence: junk",
        "Precedence: list",
        "Return-Path: <>",
        "Sender: MAILER-DAEMON@example.org",
        "X-Sendqueue-Task: c0a1b2c3d4e5f-2",
    ],
)
def test_an_auto_reply_marker_means_no_reply(line: str) -> None:
    assert parse(_with_header(_REPLY, line)) == []


@pytest.mark.parametrize(
    "subject",
    [
        "Out of Office: Your December offers",
        "Out of the office",
        "Automatic reply: Your December offers",
        "AutoReply: Your December offers",
        "Auto: Your December offers",
        "[Auto-Reply] away",
        "Abwesenheitsnotiz: Ihre Angebote",
        "Automatische Antwort: Ihre Angebote",
        "Réponse automatique : Vos offres",
        "Respuesta automática: Sus ofertas",
        "Risposta automatica: offerte",
        "Automatisch antwoord: aanbiedingen",
        "Autosvar: Erbjudanden",
    ],
)
def test_an_out_of_office_subject_means_no_reply(subject: str) -> None:
    raw = _REPLY.replace(b"Subject: Re: Your December offers", f"Subject: {subject}".encode())
    assert parse(raw) == []


def test_a_hyphenated_out_of_office_subject_means_no_reply() -> None:
    # Red team: "Out-of-Office" (with hyphens, as several autoresponders write it) is as usual
    # a marker as "Out of Office".
    for subject in ("Out-of-Office: back on Monday", "Out-of-the-Office: Your December offers"):
        raw = _REPLY.replace(b"Subject: Re: Your December offers", f"Subject: {subject}".encode())
        assert parse(raw) == [], subject


@pytest.mark.parametrize(
    "line",
    [
        "Auto-Submitted: no",
        "X-Auto-Response-Suppress: All",  # a request to the receiver, not a marker (docstring)
        "X-Auto-Response-Suppress: DR, RN, NRN, OOF, AutoReply",
        "Precedence: first-class",
    ],
)
def test_what_is_no_auto_reply_marker_keeps_the_reply(line: str) -> None:
    assert summary(parse(_with_header(_REPLY, line))) == [(R, T + "2", "anna@example.org")]


def test_the_newest_of_our_references_names_the_task() -> None:
    raw = _REPLY.replace(f"In-Reply-To: <{mid(T + '2')}@shop.example.com>\n".encode(), b"")
    raw = raw.replace(
        f"References: <{mid(T + '2')}@shop.example.com>".encode(),
        f"References: <{mid(T + '1')}@shop.example.com>\n"
        f" <{mid(T + '3')}@shop.example.com>\n <c0a1b2c3d4e5f-4@shop.example.com> <x@y>".encode(),
    )
    assert summary(parse(raw)) == [(R, T + "3", "anna@example.org")]  # the newest signed one


def test_in_reply_to_without_brackets_still_names_the_task() -> None:
    raw = _REPLY.replace(
        f"In-Reply-To: <{mid(T + '2')}@shop.example.com>".encode(),
        f"In-Reply-To: {mid(T + '2')}@shop.example.com".encode(),
    ).replace(f"References: <{mid(T + '2')}@shop.example.com>\n".encode(), b"")
    assert summary(parse(raw)) == [(R, T + "2", "anna@example.org")]


def test_a_copy_of_an_email_sendqueue_sent_is_no_reply() -> None:
    raw = _REPLY.replace(
        b"Message-ID: <5b3e1f0a-77c2-4b1e-9a0e-2f9d1c0e4a11@example.org>",
        b"Message-ID: <c0a1b2c3d4e5f-3@shop.example.com>",
    )
    assert parse(raw) == []


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


# --- hypothesis: never raises, and what it reads back -------------------------------------

_TASK_ID = re.compile(r"c[0-9a-f]{12}-[0-9]{1,9}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def check_items(items: list[Feedback], key: str | None = "inbox:7:42") -> None:
    """What any result must be: storable text, a well-formed task id or address, a time no
    later than receipt, and keys numbered when there are several."""
    for i, item in enumerate(items, 1):
        assert isinstance(item, Feedback)
        assert item.task_id is None or _TASK_ID.fullmatch(item.task_id)
        assert item.recipient is None or "@" in item.recipient
        for text in (item.detail, item.recipient or ""):
            text.encode("utf-8")  # no lone surrogates
            assert not _CONTROL.search(text)
        assert item.at.tzinfo is not None and item.at <= RECEIVED
        assert item.key == (key if len(items) == 1 else f"{key}#{i}")


_FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=4000), st.booleans())
def test_arbitrary_bytes_never_raise(raw: bytes, verp: bool) -> None:
    check_items(parse(raw, verp=verp))


# Pieces of report-shaped messages: hypothesis strings them together in any order.
_FRAGMENTS = st.sampled_from(
    [
        b"Content-Type: multipart/report; report-type=delivery-status; boundary=b\n",
        b"Content-Type: multipart/report; report-type=feedback-report; boundary=b\n",
        b"Content-Type: multipart/report; boundary*0=b; report-type*=''x\n",
        b"Content-Type: message/delivery-status\n",
        b"Content-Type: message/global-delivery-status; charset=x-unknown\n",
        b"Content-Type: message/feedback-report\n",
        b"Content-Type: message/rfc822\n",
        b"Content-Type: text/rfc822-headers\n",
        b"Content-Type: text/plain; charset=utf-7\n",
        b"Content-Transfer-Encoding: base64\n",
        b"Content-Transfer-Encoding: quoted-printable\n",
        b"\n",
        b"--b\n",
        b"--b--\n",
        b"Final-Recipient: rfc822; a@b.example\n",
        b"Final-Recipient: rfc822;\n",
        b"Original-Recipient: utf-8; \xc3\xa4@b.example\n",
        b"Action: failed\n",
        b"Action: delayed\n",
        b"Status: 5.1.1\n",
        b"Status: 4.\n",
        b"Diagnostic-Code: smtp; 550 5.1.1 \xff\xfe no\n",
        b" folded continuation\n",
        b"Arrival-Date: Tue, 1 Dec 2026 10:00:00 +0000\n",
        b"Arrival-Date: 99 Foo 99999 99:99 +9999\n",
        b"Feedback-Type: abuse\n",
        b"Original-Rcpt-To: <x@y.example>\n",
        b"Original-Mail-From: <bounces+c0a1b2c3d4e5f-1.0839bbb0683ad4fd73f5de68a6f7d31c"
        b"@mail.example.net>\n",
        b"X-Sendqueue-Task: c0a1b2c3d4e5f-1\n",
        b"Message-ID: <c0a1b2c3d4e5f-2@shop.example.com>\n",
        b"In-Reply-To: <c0a1b2c3d4e5f-2@shop.example.com>\n",
        b"References: <<<>>> <\n",
        b"From: =?utf-8?b?////?= <\x80@\x80>\n",
        b"From: MAILER-DAEMON@x.example\n",
        b"Subject: =?x-bad?q?=ff?= unsubscribe c0a1b2c3d4e5f-5.00\n",
        b"Subject: Mail delivery failed\n",
        b"This message was created automatically by mail delivery software.\n",
        b"  gone@example.de\n",
        b"<gone@example.de>:\n",
        b"    550 5.1.1 no\n",
        b"------ This is a copy of the message, including all the headers. ------\n",
        b"\x00\r\r\n",
    ]
)


@_FUZZ
@given(st.lists(_FRAGMENTS, max_size=40), st.booleans())
def test_report_shaped_junk_never_raises(fragments: list[bytes], verp: bool) -> None:
    check_items(parse(b"".join(fragments), verp=verp))


_MUTATION = st.tuples(
    st.sampled_from(["delete", "insert", "replace", "duplicate", "truncate"]),
    st.floats(0, 1),
    st.floats(0, 1),
    st.binary(min_size=1, max_size=12),
)


def mutate(raw: bytes, mutations: list[tuple[str, float, float, bytes]]) -> bytes:
    for op, where, length, data in mutations:
        at = int(where * len(raw))
        end = min(len(raw), at + int(length * 200))
        if op == "delete":
            raw = raw[:at] + raw[end:]
        elif op == "insert":
            raw = raw[:at] + data + raw[at:]
        elif op == "replace":
            raw = raw[:at] + data + raw[at + len(data) :]
        elif op == "duplicate":
            raw = raw[:end] + raw[at:end] + raw[end:]
        else:
            raw = raw[:at]
    return raw


@_FUZZ
@given(st.sampled_from(FIXTURES), st.lists(_MUTATION, min_size=1, max_size=6), st.booleans())
def test_mutated_fixtures_never_raise(
    name: str, mutations: list[tuple[str, float, float, bytes]], verp: bool
) -> None:
    check_items(parse(mutate(fixture(name), mutations), verp=verp))


_TASK_IDS = st.builds(
    lambda hexes, n: f"c{hexes}-{n}",
    st.text("0123456789abcdef", min_size=12, max_size=12),
    st.integers(0, 10**9 - 1),
)
_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_LOCALS = st.builds(
    lambda head, sep, tail: head + (sep + tail if tail else ""),
    st.text(_ALNUM, min_size=1, max_size=8),
    st.sampled_from("._+-"),
    st.text(_ALNUM, max_size=6),
)
_DOMAINS = st.builds(
    lambda labels, tld: ".".join([*labels, tld]),
    st.lists(st.text(_ALNUM, min_size=1, max_size=8), min_size=1, max_size=3),
    st.sampled_from(["com", "org", "de", "example"]),
)
_ADDRESSES = st.builds(lambda local, domain: f"{local}@{domain}", _LOCALS, _DOMAINS)
_DIAGNOSTICS = st.text(
    st.characters(codec="ascii", categories=["L", "N", "P", "Zs"], exclude_characters="\r\n"),
    max_size=80,
)


@st.composite
def recipient_blocks(draw: st.DrawFn) -> tuple[str, FeedbackKind | None, str, str]:
    """One per-recipient block of a DSN, the kind it means, its recipient and its detail."""
    action = draw(
        st.sampled_from(["failed", "delayed", "delivered", "relayed", "expanded", "", "Failed (x)"])
    )
    klass = draw(st.sampled_from("245"))
    status = f"{klass}.{draw(st.integers(0, 7))}.{draw(st.integers(0, 999))}"
    recipient = draw(_ADDRESSES)
    form = draw(st.sampled_from(["rfc822; {}", "RFC822;<{}>", "rfc822;{}", "utf-8; {}"]))
    lines = []
    if draw(st.booleans()):
        lines.append(f"Final-Recipient: {form.format(recipient)}")
    else:
        lines.append(f"Original-Recipient: rfc822;{recipient}")
    if action:
        lines.append(f"Action: {action}")
    lines.append(f"Status: {status}{draw(st.sampled_from(['', ' (comment)']))}")
    detail = status
    if draw(st.booleans()):
        diagnostic = f"smtp; {draw(_DIAGNOSTICS)}"
        spaces = [i for i, c in enumerate(diagnostic) if c == " " and diagnostic[:i].strip()]
        cut: int | None = None
        fold = draw(st.booleans())
        if fold and spaces:
            cut = draw(st.sampled_from(spaces))
        # folded where a space is, as RFC 5322 folds
        folded = diagnostic if cut is None else f"{diagnostic[:cut]}\n   {diagnostic[cut:]}"
        lines.append(f"Diagnostic-Code: {folded}")
        detail = " ".join(f"{status} {diagnostic}".split())
    verb = action.split(" ")[0].lower()
    kind: FeedbackKind | None
    if verb in ("delivered", "relayed", "expanded"):
        kind = None
    elif verb == "delayed":
        kind = S
    else:
        kind = {"5": H, "4": S, "2": None}[klass]
    return "\n".join(lines), kind, recipient, detail


_Expected = list[tuple[FeedbackKind, str | None, str, str]]


@st.composite
def dsns(draw: st.DrawFn) -> tuple[bytes, _Expected, _Expected]:
    """A generated DSN and the feedback it must give."""
    task_id = draw(_TASK_IDS)
    verp = draw(st.booleans())
    to = verp_address(BOUNCES, task_id, SECRET) if verp else BOUNCES
    returned = draw(st.sampled_from(["none", "headers", "message"]))
    names = draw(st.sampled_from(["header", "message-id", "neither"]))
    blocks = draw(st.lists(recipient_blocks(), min_size=1, max_size=3))
    head = ["From: Shop <news@shop.example.com>", f"Subject: offers {draw(_LOCALS)}"]
    if names == "header":
        head.append(f"X-Sendqueue-Task: {task_id}")
    head.append(
        f"Message-ID: <{mid(task_id)}@shop.example.com>"
        if names == "message-id"
        else "Message-ID: <x.1@other.example>"
    )
    parts = [
        "Content-Type: text/plain\n\nDelivery report.",
        "Content-Type: message/delivery-status\n\nReporting-MTA: dns; mx.example\n\n"
        + "\n\n".join(b[0] for b in blocks),
    ]
    if returned == "headers":
        parts.append("Content-Type: text/rfc822-headers\n\n" + "\n".join(head))
    elif returned == "message":
        parts.append("Content-Type: message/rfc822\n\n" + "\n".join(head) + "\n\nbody")
    raw = (
        f"From: MAILER-DAEMON@mx.example\nTo: {to}\nSubject: Undelivered Mail\nMIME-Version: 1.0\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="BND"\n\n'
        + "".join(f"--BND\n{p}\n" for p in parts)
        + "--BND--\n"
    )
    # Only a genuine VERP address or the returned email's signed Message-ID proves the email
    # (an X-Sendqueue-Task header is guessable); a report that proves none is not believed.
    signed = returned != "none" and names == "message-id"
    items: _Expected = [(k, task_id, r, d) for _, k, r, d in blocks if k is not None]
    with_verp = items if verp or signed else []
    without_verp = items if signed else []
    return raw.encode(), with_verp, without_verp


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dsns())
def test_generated_dsns_read_back(dsn: tuple[bytes, _Expected, _Expected]) -> None:
    raw, strict, unchecked = dsn
    for items, expected in ((parse(raw), strict), (parse(raw, verp=False), unchecked)):
        check_items(items)
        assert [(i.kind, i.task_id, i.recipient, i.detail) for i in items] == expected


_MARKERS = st.sampled_from(
    [
        "Auto-Submitted: {auto}",
        "X-Autoreply: yes",
        "X-Autorespond: {text}",
        "X-Autoresponder: 1",
        "Precedence: {precedence}",
        "Return-Path: <>",
        "From: {daemon}@mx.example",
        "Subject: {oof}{text}",
    ]
)


def _vary_case(text: str, flips: list[bool]) -> str:
    return "".join(
        c.upper() if f else c.lower()
        for c, f in zip(text, flips + [False] * len(text), strict=False)
    )


@st.composite
def replies(draw: st.DrawFn, *, markers: bool) -> tuple[bytes, str | None, str]:
    """A generated reply (to a sendqueue email or without reference), with some auto-reply
    markers or none; its task and its sender."""
    task_id = draw(st.one_of(st.none(), _TASK_IDS))
    sender = draw(_ADDRESSES)
    text = draw(st.text("abcdefghijklmnopqrstuvwxyz ", max_size=30))
    headers = {
        "From": f"Someone <{sender}>",
        "To": "news@shop.example.com",
        "Subject": f"Re: {text}",
        "Date": "Wed, 2 Dec 2026 10:00:00 +0100",
    }
    if task_id is not None:
        headers["In-Reply-To"] = f"<{mid(task_id)}@shop.example.com>"
    lines = []
    for template in draw(st.lists(_MARKERS, min_size=1, max_size=3)) if markers else []:
        line = template.format(
            auto=draw(st.sampled_from(["auto-replied", "auto-generated", "auto-notified", "yes"])),
            precedence=draw(st.sampled_from(["auto_reply", "bulk", "junk", "list"])),
            daemon=draw(
                st.sampled_from(["MAILER-DAEMON", "mailer-daemon", "postmaster", "Postmaster"])
            ),
            oof=draw(
                st.sampled_from(
                    [
                        "Out of Office: ",
                        "Automatic reply: ",
                        "Abwesenheitsnotiz: ",
                        "Réponse automatique : ",
                        "Auto: ",
                    ]
                )
            ),
            text=text,
        )
        name, _, value = line.partition(": ")
        if name in headers:
            headers[name] = value
        else:
            lines.append(f"{_vary_case(name, draw(st.lists(st.booleans())))}: {value}")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    raw = (
        "\n".join(draw(st.permutations(lines)))
        + "\nContent-Type: text/plain; charset=utf-8\n\nThanks!\n"
    )
    return raw.encode(), task_id, sender


@settings(max_examples=200, deadline=None)
@given(replies(markers=True))
def test_generated_auto_replies_are_never_replies(reply: tuple[bytes, str | None, str]) -> None:
    raw, _, _ = reply
    items = parse(raw)
    check_items(items)
    assert all(item.kind is not R for item in items)


@settings(max_examples=200, deadline=None)
@given(replies(markers=False))
def test_generated_replies_name_their_task_and_sender(reply: tuple[bytes, str | None, str]) -> None:
    raw, task_id, sender = reply
    assert summary(parse(raw)) == [(R, task_id, sender)]


# --- messages built to hurt: each gives an answer (pytest's timeout guards the time) ---------


def test_a_person_writing_like_a_bounce_is_still_a_reply() -> None:
    raw = _REPLY.replace(b"Subject: Re: Your December offers", b"Subject: Re: Undelivered parcel")
    raw = raw.replace(b"please call me", b"the parcel could not be delivered, please call me")
    assert summary(parse(raw)) == [(R, T + "2", "anna@example.org")]


def test_parts_nested_thousands_deep_give_nothing() -> None:
    head = b"From: MAILER-DAEMON@x.example\nContent-Type: multipart/mixed; boundary=b0\n\n"
    body = b"".join(
        b"--b%d\nContent-Type: multipart/mixed; boundary=b%d\n\n" % (i, i + 1) for i in range(3000)
    )
    assert parse(head + body) == []
    assert parse(b"From: a@b.example\nContent-Type: message/rfc822\n\n" * 3000) == []


def test_a_report_on_thousands_of_recipients_gives_at_most_max_items() -> None:
    block = b"Final-Recipient: rfc822; a@b.example\nAction: failed\nStatus: 5.1.1\n\n"
    raw = (
        b"From: x@y.example\nContent-Type: multipart/report; report-type=delivery-status;"
        b" boundary=b\n\n--b\nContent-Type: text/rfc822-headers\n\n"
        + f"Message-ID: <{mid(T + '1')}@shop.example.com>\n".encode()
        + b"\n--b\nContent-Type: message/delivery-status\n\n"
        + block * 5000
    )
    items = parse(raw, verp=False)
    assert len(items) == MAX_ITEMS
    assert items[-1].key == f"inbox:7:42#{MAX_ITEMS}"


@pytest.mark.parametrize(
    "raw",
    [
        b"From: MAILER-DAEMON@x.example\nSubject: Mail delivery failed\n\n"
        b"created automatically by mail delivery software\n" + b"-" * 60_000 + b"x\n",
        b"From: MAILER-DAEMON@x.example\nSubject: Mail delivery failed\n\npermanent error\n"
        + b" " * 60_000
        + b"a@b.example"
        + b" " * 60_000
        + b"x\n",
        b"From: " + b"(" * 50_000 + b"\n\nhi\n",
        b"From: a@b.example\nSubject: " + b" " * 60_000 + b"x\n\nhi\n",
        b"From: a@b.example\nSubject: " + b"=?utf-8?q?a?= " * 20_000 + b"\n\nhi\n",
    ],
    ids=["dashes", "spaces", "comments", "subject-spaces", "encoded-words"],
)
def test_long_runs_that_could_make_a_parser_backtrack_are_read(raw: bytes) -> None:
    check_items(parse(raw))


@pytest.mark.parametrize("encoding", ["base64", "quoted-printable"])
def test_a_delivery_status_part_sent_encoded_is_decoded(encoding: str) -> None:
    fields = b"Reporting-MTA: dns; x\n\nFinal-Recipient: rfc822; a@b.example\nAction: failed\n"
    fields += b"Status: 5.1.1\nDiagnostic-Code: smtp; 550 5.1.1 caf\xc3\xa9 user=unknown\n"
    body = base64.encodebytes(fields) if encoding == "base64" else quopri.encodestring(fields)
    raw = (
        b"From: x@y.example\nContent-Type: multipart/report; report-type=delivery-status;"
        b" boundary=b\n\n--b\nContent-Type: message/delivery-status\n"
        b"Content-Transfer-Encoding: " + encoding.encode() + b"\n\n" + body + b"\n--b\n"
        b"Content-Type: text/rfc822-headers\n\n"
        + f"Message-ID: <{mid(T + '1')}@shop.example.com>\n".encode()
        + b"\n--b--\n"
    )
    assert [(i.kind, i.recipient, i.detail) for i in parse(raw, verp=False)] == [
        (H, "a@b.example", "5.1.1 smtp; 550 5.1.1 café user=unknown")
    ]


def test_a_reply_to_an_email_ses_sent_counts_by_its_sender() -> None:
    # SES writes its own Message-ID, so the reply cannot name the task: it is a reply from its
    # From address (the service applies it only while that address has Pending emails)
    raw = (
        b"From: Anna <anna@example.org>\nTo: news@shop.example.com\nSubject: Re: offers\n"
        b"In-Reply-To: <0102018c1a2b-5e6f-4711-8899-aabbccddeeff-000000@eu-west-1.amazonses.com>\n"
        b"Message-ID: <r1@example.org>\n\nYes please.\n"
    )
    assert summary(parse(raw)) == [(R, None, "anna@example.org")]
    other = raw.replace(b"eu-west-1.amazonses.com", b"mail.other.example")
    assert parse(other) == []


def _with_list_unsubscribe(raw: bytes, marker: bytes, token: str) -> bytes:
    """``raw`` with the List-Unsubscribe header every email sendqueue sends (with the public
    URL and key set) added to the returned message, before its ``marker`` line."""
    line = f"List-Unsubscribe: <https://mail.shop.example.com/u/{token}>\n".encode()
    assert raw.count(marker) == 1
    return raw.replace(marker, line + marker)


def test_a_complaint_whose_returned_email_carries_its_signed_unsubscribe_link_is_believed() -> None:
    # RFC 5965 makes Original-Mail-From optional and the Return-Path is written at final
    # delivery, so a genuine complaint (AOL, Hotmail JMRP) may name no VERP address; the
    # returned email's own List-Unsubscribe token is signed with the same key and proves it.
    # (The fixtures' Message-IDs are written unsigned here, so the link is the only proof.)
    for name, task, marker in (
        ("aol-arf.eml", T + "13", b"X-Sendqueue-Task: c0a1b2c3d4e5f-13\n"),
        ("hotmail-jmrp.eml", T + "14", b"Message-ID: <c0a1b2c3d4e5f-14@shop.example.com>\n"),
    ):
        genuine = sign_task(task, SECRET, TokenPurpose.UNSUBSCRIBE)
        raw = _with_list_unsubscribe(unsigned(fixture(name)), marker, genuine)
        assert summary(parse(raw)) == EXPECTED[name]
        forged = genuine[:-1] + ("0" if genuine[-1] != "0" else "1")
        assert parse(_with_list_unsubscribe(unsigned(fixture(name)), marker, forged)) == []


def test_a_report_is_believed_by_the_signed_token_of_the_mailto_link_too() -> None:
    token = sign_task(T + "13", SECRET, TokenPurpose.UNSUBSCRIBE)
    marker = b"X-Sendqueue-Task: c0a1b2c3d4e5f-13\n"
    mailto = f"mailto:unsubscribe@shop.example.com?subject=unsubscribe%20{token}"
    line = f"List-Unsubscribe: <{mailto}>\n"
    raw = unsigned(fixture("aol-arf.eml")).replace(marker, line.encode() + marker)
    assert summary(parse(raw)) == EXPECTED["aol-arf.eml"]
    assert parse(unsigned(fixture("aol-arf.eml"))) == []  # without the link: nothing proven
