"""The ``SENDQUEUE_MAILER`` URL, taken apart by the one parser both the settings (at startup)
and the mailers (:func:`~sendqueue.adapters.mail.factory.mailer_from_url`) use: a URL the
settings accept always builds a mailer, so no send dead-letters for a malformed URL.

No smtplib connection and no boto3 here: the settings validate without the ``aws`` extra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.transports import TransportRules, mask_url

__all__ = [
    "DEFAULT_PORTS",
    "UNREADABLE",
    "MaildirUrl",
    "MailerUrl",
    "Security",
    "SesUrl",
    "SmtpUrl",
    "check_mailer_url",
    "parse_mailer_url",
    "parse_url_query",
    "redact_mailer_url",
    "split_url",
]

Security = Literal["starttls", "tls", "none"]
_SECURITIES: tuple[Security, ...] = ("starttls", "tls", "none")
#: The port used when a URL names none: submission (587), submissions (465), SMTP (25).
DEFAULT_PORTS: dict[str, int] = {"starttls": 587, "tls": 465, "none": 25}
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
_FIELD = "mailer"


@dataclass(frozen=True)
class MaildirUrl:
    """``maildir:DIR``."""

    directory: str


@dataclass(frozen=True)
class SmtpUrl:
    """``smtp://user:pass@host:port?security=...&timeout=...``, decoded."""

    host: str
    port: int
    security: Security
    username: str | None
    password: str | None = field(repr=False)
    timeout: float


@dataclass(frozen=True)
class SesUrl:
    """``ses:REGION?configuration_set=NAME`` (an empty region: boto3's own chain)."""

    region: str | None
    configuration_set: str | None


MailerUrl = MaildirUrl | SmtpUrl | SesUrl


def redact_mailer_url(url: str) -> str:
    """``url`` with its password replaced, for error messages (:func:`mask_url`: robust to any
    character a password holds)."""
    return mask_url(url)


#: The reason given for a URL whose user or password cannot be told from its host: never the
#: parser's own message, which may quote a piece of the password.
UNREADABLE = (
    "malformed URL: a port is 1..65535, and the characters / ? # @ : [ ] % in the user and "
    "the password are percent-encoded (%2F %3F %23 %40 %3A %5B %5D %25)"
)


def split_url(url: str, field: str) -> SplitResult:
    """``urlsplit(url)`` with its port read, when its user and password end where its host
    starts; InvalidField naming ``field`` (the URL masked, no parser message) otherwise."""
    shown = mask_url(url)
    rest = url.partition("://")[2]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if "@" in rest[end:]:  # a raw "/", "?" or "#" in the password, or an "@" after the host
        raise InvalidField(field, shown, UNREADABLE)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0..65535
    except ValueError as exc:
        # only this message quotes nothing of the URL (others quote the netloc or the port)
        fixed = str(exc) == "Port out of range 0-65535"
        raise InvalidField(field, shown, f"malformed URL: {exc}" if fixed else UNREADABLE) from None
    return parts


def parse_url_query(
    shown: str, query: str, known: frozenset[str], kind: str, *, field: str = _FIELD
) -> dict[str, str]:
    """The parameters of a URL's query, each given at most once and all of them ``known``;
    raises ``InvalidField(field, shown, ...)`` otherwise (``shown``: the redacted URL)."""
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise InvalidField(field, shown, f"malformed query: {exc}") from exc
    unknown = sorted(set(values) - known)
    if unknown:
        use = ", ".join(sorted(known))
        raise InvalidField(field, shown, f"unknown {kind} parameter {unknown[0]!r}; use {use}")
    twice = sorted(name for name, given in values.items() if len(given) > 1)
    if twice:
        raise InvalidField(field, shown, f"the parameter {twice[0]} is given twice")
    return {name: given[0] for name, given in values.items()}


def _smtp(url: str) -> SmtpUrl:
    shown = redact_mailer_url(url)
    parts = split_url(url, _FIELD)
    port = parts.port
    if parts.scheme != "smtp" or not parts.hostname:
        raise InvalidField(_FIELD, shown, "expected smtp://user:pass@host:port?security=...")
    if parts.path not in {"", "/"} or parts.fragment:
        raise InvalidField(_FIELD, shown, "an smtp:// URL has no path or fragment")
    if port == 0:
        raise InvalidField(_FIELD, shown, "the port must be 1..65535")
    query = parse_url_query(shown, parts.query, frozenset({"security", "timeout"}), "smtp://")
    security = query.get("security", "starttls")
    if security not in _SECURITIES:
        raise InvalidField(_FIELD, shown, "security must be starttls, tls or none")
    try:
        timeout = float(query.get("timeout", "30"))
    except ValueError as exc:
        raise InvalidField(_FIELD, shown, "timeout must be a number of seconds") from exc
    if not 0 < timeout < float("inf"):
        raise InvalidField(_FIELD, shown, "timeout must be greater than 0")
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return SmtpUrl(
        host=parts.hostname,
        port=port if port is not None else DEFAULT_PORTS[security],
        security=security,
        username=username or None,
        password=password if username else None,
        timeout=timeout,
    )


def _ses(url: str) -> SesUrl:
    rest = url[len("ses:") :]
    region, _, query = rest.partition("?")
    shown = mask_url(url)
    if region and not _REGION.fullmatch(region):
        raise InvalidField(_FIELD, shown, "expected ses:REGION, e.g. ses:eu-west-1")
    options = parse_url_query(shown, query, frozenset({"configuration_set"}), "ses:")
    return SesUrl(region or None, options.get("configuration_set") or None)


def parse_mailer_url(url: str) -> MailerUrl:
    """``maildir:DIR``, ``smtp://...`` or ``ses:REGION``, taken apart; raises
    ``InvalidField("mailer", ...)`` (whose value never shows the password) for anything else."""
    if url.startswith("maildir:"):
        directory = url[len("maildir:") :]
        if not directory:
            raise InvalidField(
                _FIELD, "maildir:", "maildir: needs a directory, e.g. maildir:./outbox"
            )
        return MaildirUrl(directory)
    if url.startswith("smtp:"):
        return _smtp(url)
    if url.startswith("ses:"):
        return _ses(url)
    raise InvalidField(
        _FIELD,
        redact_mailer_url(url),
        "expected maildir:DIR, smtp://user:pass@host:port?security=... or ses:REGION",
    )


def check_mailer_url(
    url: str, rules: TransportRules, *, field: str = _FIELD, oauth: bool = False
) -> MailerUrl:
    """:func:`parse_mailer_url` and then ``rules`` (no maildir: in production, no password in
    plain text to another machine, only allowed hosts); InvalidField naming ``field``. With
    ``oauth`` the sign-in sends an access token, which counts as a password."""
    try:
        parsed = parse_mailer_url(url)
    except InvalidField as exc:
        raise InvalidField(field, exc.value, exc.reason) from None
    shown = mask_url(url)
    if isinstance(parsed, MaildirUrl):
        rules.check_maildir(field, shown)
    elif isinstance(parsed, SmtpUrl):
        rules.check_host(
            field,
            shown,
            parsed.host,
            port=parsed.port,
            password=parsed.password is not None or oauth,
            encrypted=parsed.security != "none",
        )
    return parsed
