"""The ``SENDQUEUE_MAILER`` URL, taken apart by the one parser both the settings (at startup)
and the mailers (:func:`~sendqueue.adapters.mail.factory.mailer_from_url`) use: a URL the
settings accept always builds a mailer, so no send dead-letters for a malformed URL.

No smtplib connection and no boto3 here: the settings validate without the ``aws`` extra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from sendqueue.domain.errors import InvalidField

__all__ = [
    "DEFAULT_PORTS",
    "MaildirUrl",
    "MailerUrl",
    "Security",
    "SesUrl",
    "SmtpUrl",
    "parse_mailer_url",
    "parse_url_query",
    "redact_mailer_url",
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
    password: str | None
    timeout: float


@dataclass(frozen=True)
class SesUrl:
    """``ses:REGION?configuration_set=NAME`` (an empty region: boto3's own chain)."""

    region: str | None
    configuration_set: str | None


MailerUrl = MaildirUrl | SmtpUrl | SesUrl


def redact_mailer_url(url: str) -> str:
    """``url`` with its password replaced, for error messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return url.split("@", 1)[-1] if "@" in url else url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


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
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidField(_FIELD, shown, f"malformed URL: {exc}") from exc
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
    if region and not _REGION.fullmatch(region):
        raise InvalidField(_FIELD, url, f"expected ses:REGION, e.g. ses:eu-west-1, got {region!r}")
    options = parse_url_query(url, query, frozenset({"configuration_set"}), "ses:")
    return SesUrl(region or None, options.get("configuration_set") or None)


def parse_mailer_url(url: str) -> MailerUrl:
    """``maildir:DIR``, ``smtp://...`` or ``ses:REGION``, taken apart; raises
    ``InvalidField("mailer", ...)`` (whose value never shows the password) for anything else."""
    if url.startswith("maildir:"):
        directory = url[len("maildir:") :]
        if not directory:
            raise InvalidField(_FIELD, url, "maildir: needs a directory, e.g. maildir:./outbox")
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
