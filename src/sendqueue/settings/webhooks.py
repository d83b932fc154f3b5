"""The webhooks' settings (``SENDQUEUE_WEBHOOK_*``): a base of
:class:`sendqueue.settings.Settings`, read with the same ``SENDQUEUE_`` prefix; kept apart so
that each settings module stays readable."""

from __future__ import annotations

from pydantic import Field, field_validator

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.webhook_safety import AllowList

from .transport import TransportSettings

__all__ = ["WebhookSettings"]

_VARIABLE = "SENDQUEUE_WEBHOOK_ALLOW_HOSTS"


class WebhookSettings(TransportSettings):
    """Where webhooks may go and how their deliveries are retried."""

    webhook_allow_hosts: str = Field(
        "",
        description="comma-separated host names, IPs and CIDRs webhooks may reach although "
        "they are private, loopback, link-local or reserved (checked on the URL's literal IP "
        "and on every address its name resolves to)",
    )
    webhook_retry_base: float = Field(
        5.0, ge=0.05, le=3600, description="seconds before the first retry of a failed delivery"
    )
    webhook_retry_cap: float = Field(
        3600.0, ge=0.05, le=86400, description="the longest wait between two retries (seconds)"
    )
    webhook_give_up_after: float = Field(
        86400.0,
        ge=1,
        le=7 * 86400,
        description="seconds an endpoint's head event may keep failing before the endpoint is "
        "disabled and the alarm raised",
    )
    webhook_poll_interval: float = Field(
        0.5, ge=0.01, le=60, description="seconds between two reads of the change log for webhooks"
    )
    webhook_timeout: float = Field(
        10.0, ge=0.1, le=60, description="seconds one webhook delivery may take"
    )
    dead_letter_relay_interval: float = Field(
        5.0,
        ge=0.1,
        le=3600,
        description="seconds between two reads of the dead-letter queue by the webhook "
        "deliveries, which copy letters not yet in the change log there (dead_letter events)",
    )

    @field_validator("webhook_allow_hosts")
    @classmethod
    def _allow_list(cls, value: str) -> str:
        try:
            AllowList.parse(value, field=_VARIABLE)
        except InvalidField as exc:
            raise ValueError(f"{_VARIABLE}: {exc.reason}, not {exc.value!r}") from None
        return value

    @property
    def webhook_allow_list(self) -> AllowList:
        """The parsed allow-list."""
        return AllowList.parse(self.webhook_allow_hosts, field=_VARIABLE)
