"""The ``SENDQUEUE_FEEDBACK_IMAP`` URL, taken apart by the one parser both the settings (at
startup) and :meth:`~sendqueue.adapters.imap.source.ImapFeedbackSource.from_url` use, with the
mailer URL's rules: percent-decoded credentials, ``security=starttls|tls|none``, a port by
security, and error messages that name the setting and never show the password.

- ``imap://user:pass@host:143/INBOX?security=starttls`` (the default security for imap://);
- ``imaps://user:pass@host/INBOX`` (implicit TLS, port 993);
- the path is the folder (percent-decoded; none: ``INBOX``); ``timeout=30`` bounds each socket
  operation, in seconds.

No imapclient here: the settings validate without opening anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast
from urllib.parse import unquote

from sendqueue.adapters.mail.url import Security, parse_url_query, redact_mailer_url, split_url
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.transports import TransportRules

__all__ = [
    "DEFAULT_IMAP_PORTS",
    "MAX_SENDER_TIMEOUT",
    "ImapUrl",
    "check_imap_url",
    "parse_imap_url",
    "redact_imap_url",
]

#: The port used when a URL names none: IMAP (143, STARTTLS or plain) and IMAPS (993).
DEFAULT_IMAP_PORTS: dict[str, int] = {"starttls": 143, "tls": 993, "none": 143}
_SECURITIES = ("starttls", "tls", "none")
_FIELD = "feedback_imap"
#: The longest ``timeout`` a sender's own mailbox may take (:func:`check_imap_url`).
MAX_SENDER_TIMEOUT = 120.0
_EXPECTED = "expected imap://user:pass@host:143/INBOX?security=starttls|tls|none or imaps://"


@dataclass(frozen=True)
class ImapUrl:
    """An IMAP mailbox URL, decoded. ``name`` is its identity without the password (the
    feedback cursor's key, and what logs show): ``imap://user@host:port/folder``."""

    host: str
    port: int
    security: Security
    username: str
    password: str = field(repr=False)
    folder: str
    timeout: float

    @property
    def name(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"imap://{self.username}@{host}:{self.port}/{self.folder}"


def redact_imap_url(url: str) -> str:
    """``url`` with its password replaced, for error messages."""
    return redact_mailer_url(url)


def parse_imap_url(url: str, *, field: str = _FIELD, oauth: bool = False) -> ImapUrl:
    """``imap://`` or ``imaps://`` taken apart; raises ``InvalidField(field, ...)`` (whose value
    never shows the password) for anything else. With ``oauth`` (XOAUTH2 sign-in) the user and
    password may be left out: the password is not used, the user defaults to the sender's."""
    shown = redact_imap_url(url)
    parts = split_url(url, field)
    port = parts.port
    if parts.scheme not in {"imap", "imaps"} or not parts.hostname:
        raise InvalidField(field, shown, _EXPECTED)
    if parts.fragment:
        raise InvalidField(field, shown, "an IMAP URL has no fragment")
    if port == 0:
        raise InvalidField(field, shown, "the port must be 1..65535")
    query = parse_url_query(
        shown, parts.query, frozenset({"security", "timeout"}), f"{parts.scheme}://", field=field
    )
    default = "tls" if parts.scheme == "imaps" else "starttls"
    security = query.get("security", default)
    if security not in _SECURITIES:
        raise InvalidField(field, shown, "security must be starttls, tls or none")
    if parts.scheme == "imaps" and security != "tls":
        raise InvalidField(field, shown, "imaps:// is implicit TLS; use imap:// for " + security)
    try:
        timeout = float(query.get("timeout", "30"))
    except ValueError as exc:
        raise InvalidField(field, shown, "timeout must be a number of seconds") from exc
    if not 0 < timeout < float("inf"):
        raise InvalidField(field, shown, "timeout must be greater than 0")
    username = unquote(parts.username) if parts.username is not None else ""
    password = unquote(parts.password) if parts.password is not None else ""
    if not oauth and (not username or not password):
        raise InvalidField(field, shown, "the mailbox's user and password are required")
    folder = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path) or "INBOX"
    if any(ch in folder for ch in "\r\n\0"):
        raise InvalidField(field, shown, "the folder may not contain control characters")
    return ImapUrl(
        host=parts.hostname,
        port=port if port is not None else DEFAULT_IMAP_PORTS[security],
        security=cast(Security, security),
        username=username,
        password=password,
        folder=folder,
        timeout=timeout,
    )


def check_imap_url(
    url: str,
    rules: TransportRules,
    *,
    field: str = _FIELD,
    oauth: bool = False,
    max_timeout: float | None = None,
) -> ImapUrl:
    """:func:`parse_imap_url` and then ``rules`` (the password, or with ``oauth`` the access
    token, never in plain text to another machine; only allowed hosts) and, given
    ``max_timeout`` (a sender's mailbox: :data:`MAX_SENDER_TIMEOUT`), a ``timeout`` of at most
    that; InvalidField naming ``field``."""
    parsed = parse_imap_url(url, field=field, oauth=oauth)
    if max_timeout is not None and parsed.timeout > max_timeout:
        raise InvalidField(
            field,
            redact_imap_url(url),
            f"timeout must be at most {max_timeout:g} seconds: the mailboxes are read one "
            "after another, and a silent server holds the others back for up to its timeout",
        )
    rules.check_host(
        field,
        redact_imap_url(url),
        parsed.host,
        port=parsed.port,
        password=True,
        encrypted=parsed.security != "none",
    )
    return parsed
