"""Webhooks: events out of the change log, signed per Standard Webhooks, delivered in order and
at least once. :class:`WebhookService` holds the endpoints' use cases, :class:`WebhookDelivery`
the delivery loop's pass, :class:`DeadLetterRelay` the dead letters' way into the change log
(docs/webhooks.md)."""

from sendqueue.services.webhooks.dead_letters import DeadLetterLog, DeadLetterRelay
from sendqueue.services.webhooks.delivery import DeliveryPolicy, PassReport, WebhookDelivery
from sendqueue.services.webhooks.endpoints import MAX_REDELIVER, WebhookService
from sendqueue.services.webhooks.views import (
    MASKED_SECRET,
    DeliveryPage,
    DeliveryView,
    WebhookCreated,
    WebhookView,
    mask_secret,
)

__all__ = [
    "MASKED_SECRET",
    "MAX_REDELIVER",
    "DeadLetterLog",
    "DeadLetterRelay",
    "DeliveryPage",
    "DeliveryPolicy",
    "DeliveryView",
    "PassReport",
    "WebhookCreated",
    "WebhookDelivery",
    "WebhookService",
    "WebhookView",
    "mask_secret",
]
