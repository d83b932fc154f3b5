"""The SES event parser (sendqueue.domain.ses_events): bounces and complaints as SES publishes
them (event publishing and identity notifications), raw or in SNS's envelope, to Feedback."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.feedback import FeedbackKind
from sendqueue.domain.ses_events import feedback_from_ses, ses_event_of

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TASK = "c0123456789ab-7"


def mail(
    *,
    task_header: str | None = TASK,
    message_id: str = f"<{TASK}@example.com>",
    to: str = "ann@example.org",
) -> dict[str, Any]:
    """The ``mail`` object of an SES event, as SES writes it for a raw message."""
    headers = [
        {"name": "From", "value": "News <news@example.com>"},
        {"name": "To", "value": to},
        {"name": "Message-ID", "value": message_id},
        {"name": "Subject", "value": "Hello"},
    ]
    if task_header is not None:
        headers.append({"name": "X-Sendqueue-Task", "value": task_header})
    return {
        "timestamp": "2026-12-01T10:00:00.000Z",
        "source": "news@example.com",
        "sourceArn": "arn:aws:ses:eu-central-1:123456789012:identity/example.com",
        "sendingAccountId": "123456789012",
        "messageId": "0107018c1f4a5b6c-1234abcd-5678-90ef-1234-567890abcdef-000000",
        "destination": [to],
        "headersTruncated": False,
        "headers": headers,
        "commonHeaders": {
            "from": ["News <news@example.com>"],
            "to": [to],
            "messageId": message_id,
            "subject": "Hello",
        },
        "tags": {"ses:configuration-set": ["sq-feedback"]},
    }


def bounce(
    bounce_type: str = "Permanent",
    recipients: list[dict[str, Any]] | None = None,
    *,
    key: str = "feedback-1",
    **mail_args: Any,
) -> dict[str, Any]:
    return {
        "eventType": "Bounce",
        "bounce": {
            "bounceType": bounce_type,
            "bounceSubType": "General",
            "bouncedRecipients": recipients
            if recipients is not None
            else [
                {
                    "emailAddress": "ann@example.org",
                    "action": "failed",
                    "status": "5.1.1",
                    "diagnosticCode": "smtp; 550 5.1.1 user unknown",
                }
            ],
            "timestamp": "2026-12-01T10:00:05.123Z",
            "feedbackId": key,
            "reportingMTA": "dsn; a1-2.smtp-out.eu-central-1.amazonses.com",
        },
        "mail": mail(**mail_args),
    }


def complaint(feedback_type: str | None = "abuse", **mail_args: Any) -> dict[str, Any]:
    part: dict[str, Any] = {
        "feedbackId": "complaint-1",
        "complaintSubType": None,
        "complainedRecipients": [{"emailAddress": "ann@example.org"}],
        "timestamp": "2026-12-01T11:00:00.000Z",
        "userAgent": "Yahoo!-Mail-Feedback/2.0",
        "arrivalDate": "2026-12-01T10:59:00.000Z",
    }
    if feedback_type is not None:
        part["complaintFeedbackType"] = feedback_type
    return {"eventType": "Complaint", "complaint": part, "mail": mail(**mail_args)}


def sns(document: dict[str, Any]) -> dict[str, Any]:
    """SNS's envelope, as an SQS message body holds it when raw message delivery is off."""
    return {
        "Type": "Notification",
        "MessageId": "2f1c8c2e-0000-4000-8000-000000000001",
        "TopicArn": "arn:aws:sns:eu-central-1:123456789012:sq-feedback",
        "Message": json.dumps(document),
        "Timestamp": "2026-12-01T10:00:06.000Z",
        "SignatureVersion": "1",
    }


# -- shapes --------------------------------------------------------------------------------
@pytest.mark.parametrize("wrap", ["raw", "raw-text", "sns", "sns-bytes"])
def test_a_permanent_bounce_is_a_hard_bounce_of_the_task(wrap: str) -> None:
    event = bounce()
    body: object = {
        "raw": event,
        "raw-text": json.dumps(event),
        "sns": json.dumps(sns(event)),
        "sns-bytes": json.dumps(sns(event)).encode(),
    }[wrap]
    [item] = feedback_from_ses(body, received_at=NOW)
    assert item.kind is FeedbackKind.HARD_BOUNCE
    assert item.task_id == TASK
    assert item.recipient == "ann@example.org"
    assert item.detail == "5.1.1 smtp; 550 5.1.1 user unknown"
    assert item.key == "feedback-1#0"
    assert item.at == datetime(2026, 12, 1, 10, 0, 5, 123000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("bounce_type", "kind"),
    [("Transient", FeedbackKind.SOFT_BOUNCE), ("Undetermined", FeedbackKind.SOFT_BOUNCE)],
)
def test_transient_and_undetermined_bounces_are_soft(bounce_type: str, kind: FeedbackKind) -> None:
    [item] = feedback_from_ses(bounce(bounce_type), received_at=NOW)
    assert item.kind is kind


def test_an_identity_notification_is_read_like_an_event() -> None:
    event = bounce()
    event["notificationType"] = event.pop("eventType")
    [item] = feedback_from_ses(event, received_at=NOW)
    assert (item.kind, item.task_id) == (FeedbackKind.HARD_BOUNCE, TASK)


def test_each_bounced_recipient_is_one_feedback_with_its_own_key() -> None:
    recipients = [
        {"emailAddress": "ann@example.org", "status": "5.1.1"},
        {"emailAddress": "bob@example.org"},
    ]
    items = feedback_from_ses(bounce(recipients=recipients, task_header=None), received_at=NOW)
    assert [(i.recipient, i.key, i.detail) for i in items] == [
        ("ann@example.org", "feedback-1#0", "5.1.1"),
        ("bob@example.org", "feedback-1#1", "SES Permanent bounce (General)"),
    ]


def test_the_message_id_names_the_task_without_the_header() -> None:
    event = bounce(task_header=None)
    assert ses_event_of(json.dumps(sns(event))) == event
    [item] = feedback_from_ses(event, received_at=NOW)
    assert item.task_id == TASK
    event["mail"]["commonHeaders"] = {}  # the Message-ID header alone
    [item] = feedback_from_ses(event, received_at=NOW)
    assert item.task_id == TASK


def test_an_email_sendqueue_did_not_make_names_only_the_address() -> None:
    event = bounce(task_header="../../etc", message_id="<abc@mail.example.com>")
    [item] = feedback_from_ses(event, received_at=NOW)
    assert (item.task_id, item.recipient) == (None, "ann@example.org")


@pytest.mark.parametrize("feedback_type", ["abuse", "fraud", None])
def test_a_complaint_is_a_complaint(feedback_type: str | None) -> None:
    [item] = feedback_from_ses(sns(complaint(feedback_type)), received_at=NOW)
    assert item.kind is FeedbackKind.COMPLAINT
    assert (item.task_id, item.recipient, item.key) == (TASK, "ann@example.org", "complaint-1#0")
    assert item.detail == (feedback_type or "complaint")


def test_a_not_spam_report_is_nothing() -> None:
    assert feedback_from_ses(complaint("not-spam"), received_at=NOW) == []


def test_a_time_missing_from_the_event_is_the_time_received() -> None:
    event = bounce()
    del event["bounce"]["timestamp"]
    event["mail"]["timestamp"] = "yesterday"
    [item] = feedback_from_ses(event, received_at=NOW)
    assert item.at == NOW


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        b"\xff\xfe",
        "[]",
        "null",
        json.dumps({"eventType": "Delivery", "mail": mail()}),
        json.dumps({"eventType": "Send", "mail": mail()}),
        json.dumps({"eventType": "Bounce"}),
        json.dumps({"eventType": "Bounce", "bounce": {"bounceType": "Permanent"}}),
        json.dumps({"eventType": "Bounce", "bounce": {"bounceType": ["Permanent"]}}),
        json.dumps({"eventType": ["Bounce"], "bounce": {}}),
        json.dumps({"Type": "SubscriptionConfirmation", "Message": "You have chosen..."}),
        json.dumps({"Type": "Notification", "Message": "Successfully validated SNS topic"}),
        json.dumps(sns({"eventType": "Open", "mail": mail()})),
    ],
)
def test_other_shapes_are_nothing(body: object) -> None:
    assert feedback_from_ses(body, received_at=NOW) == []


def test_a_recipient_without_address_or_task_is_skipped() -> None:
    recipients: list[Any] = [
        {"emailAddress": ""},
        "ann@example.org",
        {"emailAddress": "bob@example.org"},
    ]
    items = feedback_from_ses(
        bounce(recipients=recipients, task_header=None, message_id="<x@y>"), received_at=NOW
    )
    assert [(i.recipient, i.key) for i in items] == [("bob@example.org", "feedback-1#2")]


# -- properties ----------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=25,
)


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The right kind of value, or any JSON in its place."""
    return st.one_of(values, JSON)


# SES's shape with every field optional and any of them replaced by arbitrary JSON.
_TIME = _maybe(
    st.sampled_from(["2026-12-01T10:00:00.000Z", "0001-01-01T00:00:00+14:00"]) | st.text()
)
_RECIPIENT = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "emailAddress": _maybe(st.just("ann@example.org") | st.text()),
            "status": _maybe(st.just("5.1.1")),
            "diagnosticCode": _maybe(st.text()),
        },
    )
)
_PART = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "bounceType": _maybe(st.sampled_from(["Permanent", "Transient", "Undetermined"])),
            "bounceSubType": _maybe(st.just("General")),
            "bouncedRecipients": _maybe(st.lists(_RECIPIENT, max_size=3)),
            "complainedRecipients": _maybe(st.lists(_RECIPIENT, max_size=3)),
            "complaintFeedbackType": _maybe(st.sampled_from(["abuse", "not-spam", "NOT-SPAM"])),
            "feedbackId": _maybe(st.just("f-1")),
            "timestamp": _TIME,
        },
    )
)
_HEADER = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "name": _maybe(st.sampled_from(["X-Sendqueue-Task", "Message-ID", "message-id"])),
            "value": _maybe(st.sampled_from([TASK, f"<{TASK}@example.com>"]) | st.text()),
        },
    )
)
_MAIL = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "headers": _maybe(st.lists(_HEADER, max_size=4)),
            "commonHeaders": _maybe(
                st.fixed_dictionaries({}, optional={"messageId": _maybe(st.text())})
            ),
            "timestamp": _TIME,
        },
    )
)
SES_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "eventType": _maybe(st.sampled_from(["Bounce", "Complaint"])),
        "notificationType": _maybe(st.sampled_from(["Bounce", "Complaint"])),
        "bounce": _PART,
        "complaint": _PART,
        "mail": _MAIL,
    },
)
SES_LIKE = SES_LIKE | SES_LIKE.map(sns)


@settings(max_examples=200, deadline=None)
@given(st.one_of(JSON, SES_LIKE), st.booleans())
def test_it_never_raises_on_arbitrary_json(document: object, as_text: bool) -> None:
    body = json.dumps(document) if as_text else document
    for item in feedback_from_ses(body, received_at=NOW):
        assert item.task_id is not None or item.recipient
        assert item.at.tzinfo is not None


ADDRESS = st.from_regex(r"[a-z][a-z0-9.]{0,10}@[a-z]{1,8}\.(org|com|de)", fullmatch=True)
STATUS = st.from_regex(r"[45]\.[0-9]\.[0-9]{1,2}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["Permanent", "Transient", "Undetermined", "abuse", "not-spam"]),
    addresses=st.lists(ADDRESS, min_size=1, max_size=4),
    status=STATUS,
    diagnostic=st.text(min_size=1, max_size=40).map(str.strip).filter(bool),
    campaign=st.from_regex(r"c[0-9a-f]{12}", fullmatch=True),
    position=st.integers(0, 10**9 - 1),
    by_header=st.booleans(),
    feedback_id=st.from_regex(r"[0-9a-f]{16}-[0-9a-f-]{10,30}", fullmatch=True),
    when=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    through_sns=st.booleans(),
)
def test_generated_events_round_trip(
    kind: str,
    addresses: list[str],
    status: str,
    diagnostic: str,
    campaign: str,
    position: int,
    by_header: bool,
    feedback_id: str,
    when: datetime,
    through_sns: bool,
) -> None:
    """An event written from known values gives back exactly those values."""
    task = f"{campaign}-{position}"
    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    header = task if by_header else None
    if kind in {"abuse", "not-spam"}:
        event = complaint(kind, task_header=header, message_id=f"<{task}@example.com>")
        event["complaint"]["complainedRecipients"] = [{"emailAddress": a} for a in addresses]
    else:
        recipients = [
            {"emailAddress": a, "status": status, "diagnosticCode": diagnostic} for a in addresses
        ]
        event = bounce(kind, recipients, task_header=header, message_id=f"<{task}@example.com>")
    part = event["complaint" if "complaint" in event else "bounce"]
    part["feedbackId"], part["timestamp"] = feedback_id, stamp
    body = json.dumps(sns(event) if through_sns else event)
    at = when.replace(microsecond=when.microsecond // 1000 * 1000)  # SES writes milliseconds

    items = feedback_from_ses(body, received_at=NOW)

    if kind == "not-spam":
        assert items == []
        return
    want_kind = {
        "Permanent": FeedbackKind.HARD_BOUNCE,
        "Transient": FeedbackKind.SOFT_BOUNCE,
        "Undetermined": FeedbackKind.SOFT_BOUNCE,
        "abuse": FeedbackKind.COMPLAINT,
    }[kind]
    want_detail = "abuse" if kind == "abuse" else f"{status} {diagnostic}"
    assert [(i.kind, i.task_id, i.recipient, i.key, i.detail, i.at) for i in items] == [
        (want_kind, task, a, f"{feedback_id}#{n}", want_detail, at) for n, a in enumerate(addresses)
    ]
