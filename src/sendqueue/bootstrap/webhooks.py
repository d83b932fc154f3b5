"""The composition root's part for webhooks: the HTTP transport under the allow-list, the
dead-letter relay (and the alarm that runs it), the delivery loop's pass and the endpoints'
service. Apart from :mod:`sendqueue.bootstrap` only to keep each module short; the container's
``dead_letter_relay``, ``webhook_delivery`` and ``webhooks`` are the way in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sendqueue.adapters.webhooks import HttpWebhookTransport
from sendqueue.ports import Alarm
from sendqueue.ports.webhooks import WebhookAlarm, WebhookTransport
from sendqueue.services.operations.dead_letters import DeadLetterQueue
from sendqueue.services.webhooks import (
    DeadLetterLog,
    DeadLetterRelay,
    DeliveryPolicy,
    WebhookDelivery,
    WebhookService,
)

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = [
    "dead_letter_log",
    "dead_letter_queue",
    "dead_letter_relay",
    "webhook_delivery",
    "webhook_service",
    "webhook_transport",
]


def dead_letter_relay(c: Container) -> DeadLetterRelay:
    """Copies the execution layer's dead letters into the change log, once per letter id
    (``dead_letter`` events; see :mod:`sendqueue.services.webhooks.dead_letters`). The
    scheduler and the store are opened at first use: the scheduler's own alarm runs it."""
    return DeadLetterRelay(
        lambda: c.scheduler,
        lambda: c.stores.webhooks,
        interval=c.settings.dead_letter_relay_interval,
    )


def dead_letter_log(c: Container, alarm: Alarm) -> Alarm:
    """The alarm, relaying each dead letter into the change log first."""
    return DeadLetterLog(alarm, c.dead_letter_relay)


def dead_letter_queue(c: Container) -> DeadLetterQueue:
    """Redrives that relay each letter before removing it."""
    return DeadLetterQueue(c.scheduler, c.dead_letter_relay.relay)


def webhook_transport(c: Container) -> WebhookTransport:
    """POSTs to checked addresses (SENDQUEUE_WEBHOOK_ALLOW_HOSTS), a connection kept per origin;
    https only in production, also for a URL stored before."""
    s = c.settings
    return HttpWebhookTransport(
        s.webhook_allow_list,
        timeout=s.webhook_timeout,
        https_only=s.environment == "production",
    )


def webhook_delivery(c: Container) -> WebhookDelivery:
    """The delivery loop's pass, its retries from SENDQUEUE_WEBHOOK_RETRY_* and
    SENDQUEUE_WEBHOOK_GIVE_UP_AFTER; the container's alarm says when an endpoint is disabled."""
    s = c.settings
    alarm = c.alarm
    return WebhookDelivery(
        c.stores.webhooks,
        c.stores.tasks,
        webhook_transport(c),
        c.clock,
        alarm=alarm if isinstance(alarm, WebhookAlarm) else None,
        relay=c.dead_letter_relay,
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
        c.stores.webhooks,
        c.stores.tasks,
        c.clock,
        c.webhook_delivery,
        production=c.settings.environment == "production",
    )
