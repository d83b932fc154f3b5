"""What the webhooks' use cases return: an endpoint with its secret masked
(:class:`WebhookView`), the secret once (:class:`WebhookCreated`), one delivery attempt
(:class:`DeliveryView`) and a page of the delivery log (:class:`DeliveryPage`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sendqueue.domain.webhooks import DeliveryRecord, WebhookEndpoint

__all__ = [
    "MASKED_SECRET",
    "DeliveryPage",
    "DeliveryView",
    "WebhookCreated",
    "WebhookView",
    "mask_secret",
]

MASKED_SECRET = "whsec_***"


def mask_secret(secret: str | None) -> str | None:
    """A secret as shown after its creation: ``whsec_***`` and its last 4 characters."""
    if not secret:
        return None
    return f"{MASKED_SECRET}{secret[-4:]}"


@dataclass(frozen=True)
class WebhookView:
    """An endpoint as shown outside the service layer: secrets masked, its delivery state."""

    id: str
    url: str
    event_types: list[str]
    campaign_ids: list[str]
    enabled: bool
    disabled_reason: str | None
    created_at: datetime
    secret: str | None
    """Masked: ``whsec_***`` and the last 4 characters."""
    previous_secret_expires_at: datetime | None
    """While the previous secret still signs (24 h after a rotation); None otherwise."""
    cursor: int
    """The change-log id delivered up to."""
    attempts: int
    """Failed attempts of the event at the head (0: none failing)."""
    retry_at: datetime | None
    failing_since: datetime | None

    @classmethod
    def of(cls, endpoint: WebhookEndpoint, now: datetime) -> WebhookView:
        expires = endpoint.previous_secret_expires_at
        return cls(
            id=endpoint.id,
            url=endpoint.url,
            event_types=list(endpoint.event_types),
            campaign_ids=list(endpoint.campaign_ids),
            enabled=endpoint.enabled,
            disabled_reason=endpoint.disabled_reason,
            created_at=endpoint.created_at,
            secret=mask_secret(endpoint.secret),
            previous_secret_expires_at=expires if expires is not None and expires > now else None,
            cursor=endpoint.cursor,
            attempts=endpoint.attempts,
            retry_at=endpoint.retry_at,
            failing_since=endpoint.failing_since,
        )


@dataclass(frozen=True)
class WebhookCreated:
    """An endpoint just added or rotated, with its new secret in clear: shown this once."""

    endpoint: WebhookView
    secret: str = field(repr=False)  # shown by whoever asked for it, never in a log line


@dataclass(frozen=True)
class DeliveryView:
    """One delivery attempt from the log."""

    event_id: str
    event_type: str
    at: datetime
    attempt: int
    latency_ms: int
    status: int | None
    error: str | None
    redelivery: bool
    ok: bool

    @classmethod
    def of(cls, record: DeliveryRecord) -> DeliveryView:
        return cls(
            event_id=record.event_id,
            event_type=record.event_type,
            at=record.at,
            attempt=record.attempt,
            latency_ms=record.latency_ms,
            status=record.status,
            error=record.error,
            redelivery=record.redelivery,
            ok=record.ok,
        )


@dataclass(frozen=True)
class DeliveryPage:
    """A page of an endpoint's delivery log, newest first."""

    deliveries: list[DeliveryView]
    next: str | None
    """The cursor of the next, older page (``before``); None when this page is the last."""
