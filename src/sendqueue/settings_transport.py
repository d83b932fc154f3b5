"""The transports' allow-list (``SENDQUEUE_TRANSPORT_HOSTS``): a base of
:class:`sendqueue.settings.Settings`, read with the same ``SENDQUEUE_`` prefix; kept apart so
that each settings module stays readable. The rules themselves are
:class:`~sendqueue.domain.transports.TransportRules`."""

from __future__ import annotations

from pydantic import Field, field_validator

from .domain.errors import InvalidField
from .domain.transports import parse_host_patterns
from .settings_links import LinkSettings

__all__ = ["TransportSettings"]

_VARIABLE = "SENDQUEUE_TRANSPORT_HOSTS"


class TransportSettings(LinkSettings):
    """``SENDQUEUE_TRANSPORT_HOSTS``; :attr:`transport_host_patterns` is its parsed form."""

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
