"""The transports' allow-list (``SENDQUEUE_TRANSPORT_HOSTS``) and the authserv-ids trusted in
the senders' own mailboxes (``SENDQUEUE_SENDER_MAILBOX_AUTHSERV``): a base of
:class:`sendqueue.settings.Settings`, read with the same ``SENDQUEUE_`` prefix; kept apart so
that each settings module stays readable. The rules themselves are
:class:`~sendqueue.domain.transports.TransportRules`."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.transports import parse_host_patterns

from .links import LinkSettings

__all__ = ["TransportSettings"]

_VARIABLE = "SENDQUEUE_TRANSPORT_HOSTS"
_AUTHSERV_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")


class TransportSettings(LinkSettings):
    """``SENDQUEUE_TRANSPORT_HOSTS``; :attr:`transport_host_patterns` is its parsed form.
    ``SENDQUEUE_SENDER_MAILBOX_AUTHSERV``; :attr:`sender_mailbox_authserv_ids` likewise."""

    transport_hosts: str = Field(
        "",
        description="comma-separated host names or patterns (*.example.com) the senders' own "
        "SMTP and IMAP hosts must match, when they are added or changed and at every send or "
        "poll; empty: any host",
    )

    @field_validator("transport_hosts")
    @classmethod
    def _host_patterns(cls, value: str) -> str:
        try:
            parse_host_patterns(value, _VARIABLE)
        except InvalidField as exc:
            raise ValueError(f"{_VARIABLE}: {exc.reason}, not {exc.value!r}") from None
        return value

    @property
    def transport_host_patterns(self) -> tuple[str, ...]:
        """The allow-list's patterns, lower-cased (empty: any host)."""
        return parse_host_patterns(self.transport_hosts, _VARIABLE)

    sender_mailbox_authserv: str = Field(
        "",
        description="comma-separated authserv-ids whose Authentication-Results header proves "
        "a reply's From in the senders' own mailboxes (SENDQUEUE_TRUSTED_AUTHSERV is the "
        "feedback mailbox's); name only servers that receive the mail of every sender's "
        "mailbox; empty: none, replies there count by their signed Message-ID",
    )

    @field_validator("sender_mailbox_authserv")
    @classmethod
    def _sender_authserv_ids(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            if name and not _AUTHSERV_ID.fullmatch(name):
                raise ValueError(
                    f"SENDQUEUE_SENDER_MAILBOX_AUTHSERV: {name!r} is no authserv-id (a host "
                    "name such as mx.google.com, as the server writes it first in "
                    "Authentication-Results)"
                )
        return value

    @property
    def sender_mailbox_authserv_ids(self) -> frozenset[str]:
        """The authserv-ids of SENDQUEUE_SENDER_MAILBOX_AUTHSERV, lower-cased."""
        parts = self.sender_mailbox_authserv.split(",")
        return frozenset(p.strip().lower() for p in parts if p.strip())
