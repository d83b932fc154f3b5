"""The composition root's part for webhooks: the HTTP transport under the allow-list, the
delivery loop's pass and the endpoints' service. Apart from :mod:`sendqueue.bootstrap` only to
keep each module short; the container's ``webhook_delivery`` and ``webhooks`` are the way in."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from sendqueue.adapters.webhooks import HttpWebhookTransport
from sendqueue.ports import Alarm
from sendqueue.ports.webhooks import WebhookAlarm, WebhookStore, WebhookTransport
from sendqueue.services.webhooks import DeliveryPolicy, WebhookDelivery, WebhookService
from sendqueue.services.webhooks.dead_letters import DeadLetterLog

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = ["dead_letter_log", "webhook_delivery", "webhook_service", "webhook_transport"]


def dead_letter_log(c: Container, alarm: Alarm) -> Alarm:
    """The alarm, logging each dead letter's task to the change log first (``dead_letter``
    events; see :mod:`sendqueue.services.webhooks.dead_letters`)."""
    return DeadLetterLog(alarm, lambda: cast(WebhookStore, c.store), c.clock)


def webhook_transport(c: Container) -> WebhookTransport:
    """POSTs to checked addresses (SENDQUEUE_WEBHOOK_ALLOW_HOSTS), a connection kept per origin."""
    s = c.settings
    return HttpWebhookTransport(s.webhook_allow_list, timeout=s.webhook_timeout)


def webhook_delivery(c: Container) -> WebhookDelivery:
    """The delivery loop's pass, its retries from SENDQUEUE_WEBHOOK_RETRY_* and
    SENDQUEUE_WEBHOOK_GIVE_UP_AFTER; the container's alarm says when an endpoint is disabled."""
    s = c.settings
    alarm = c.alarm
    return WebhookDelivery(
        cast(WebhookStore, c.store),
        c.store,
        webhook_transport(c),
        c.clock,
        alarm=alarm if isinstance(alarm, WebhookAlarm) else None,
        policy=DeliveryPolicy(
            retry_base=s.webhook_retry_base,
            retry_cap=s.webhook_retry_cap,
            give_up_after=s.webhook_give_up_after,
            # a killed worker's endpoints are taken over a few timeouts later
            lease_seconds=3 * s.webhook_timeout + 5,
        ),
    )


def webhook_service(c: Container) -> WebhookService:
    """The endpoints' use cases (https only in production)."""
    return WebhookService(
        cast(WebhookStore, c.store),
        c.store,
        c.clock,
        c.webhook_delivery,
        production=c.settings.environment == "production",
    )
