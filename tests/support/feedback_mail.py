"""Feedback mail as the outside world writes it, for the feedback-loop tests: any message, a
delivery status notification (a DSN, RFC 3464) and an abuse report (ARF, RFC 5965) about an
email sendqueue sent. Each is bytes with CRLF line ends, ready to be dropped into a Maildir,
appended over IMAP or mailed through Postfix."""

from __future__ import annotations

import email.utils
from collections.abc import Mapping

__all__ = ["arf_report", "dsn_report", "message"]


def message(headers: Mapping[str, str], body: str) -> bytes:
    """A message of ``headers`` (a ``Date`` first unless given) and ``body``."""
    fields = {"Date": email.utils.formatdate(), **headers}
    text = "".join(f"{k}: {v}\n" for k, v in fields.items()) + "\n" + body + "\n"
    return text.replace("\r\n", "\n").replace("\n", "\r\n").encode()


def _original(sender: str, recipient: str, message_id: str) -> str:
    """The report's last part: the headers of the email it is about."""
    return (
        "--b\nContent-Type: text/rfc822-headers\n\n"
        f"From: {sender}\nTo: {recipient}\nMessage-ID: {message_id}\n--b--"
    )


def _to(sender: str, to: str | None) -> str:
    return to if to is not None else email.utils.parseaddr(sender)[1]


def dsn_report(
    recipient: str,
    message_id: str,
    *,
    sender: str,
    to: str | None = None,
    reporter: str = "MAILER-DAEMON@mx.example",
) -> bytes:
    """A DSN saying the email ``message_id`` from ``sender`` to ``recipient`` failed for good
    (5.1.1), mailed by ``reporter`` to ``to`` (default: the sender's address)."""
    headers = {
        "From": reporter,
        "To": _to(sender, to),
        "Subject": "Undelivered Mail Returned to Sender",
        "MIME-Version": "1.0",
        "Content-Type": 'multipart/report; report-type=delivery-status; boundary="b"',
    }
    return message(
        headers,
        "--b\nContent-Type: text/plain\n\nCould not be delivered.\n"
        "--b\nContent-Type: message/delivery-status\n\nReporting-MTA: dns; mx\n\n"
        f"Final-Recipient: rfc822; {recipient}\nAction: failed\nStatus: 5.1.1\n"
        "Diagnostic-Code: smtp; 550 5.1.1 user unknown\n"
        + _original(sender, recipient, message_id),
    )


def arf_report(
    recipient: str,
    message_id: str,
    *,
    sender: str,
    to: str | None = None,
    reporter: str = "fbl@isp.example",
) -> bytes:
    """An abuse report (``Feedback-Type: abuse``): ``recipient`` marked the email
    ``message_id`` from ``sender`` as spam; mailed by ``reporter`` to ``to`` (default: the
    sender's address)."""
    headers = {
        "From": reporter,
        "To": _to(sender, to),
        "Subject": "Abuse report",
        "MIME-Version": "1.0",
        "Content-Type": 'multipart/report; report-type=feedback-report; boundary="b"',
    }
    return message(
        headers,
        "--b\nContent-Type: text/plain\n\nA complaint.\n"
        "--b\nContent-Type: message/feedback-report\n\nFeedback-Type: abuse\n"
        f"User-Agent: isp/1.0\nVersion: 1\nOriginal-Rcpt-To: <{recipient}>\n"
        + _original(sender, recipient, message_id),
    )
