"""The webhooks' HTTP transport: :class:`HttpWebhookTransport`."""

from sendqueue.adapters.webhooks.http import MAX_BODY, HttpWebhookTransport, Resolver

__all__ = ["MAX_BODY", "HttpWebhookTransport", "Resolver"]
