"""The email the send worker sends for a task: From and Reply-To of its sender (else the
campaign's), the sender's fields filled in, the one-click unsubscribe link and footer, the VERP
bounce address, and the header that names the task.

A task id sendqueue did not make (a task written by hand) cannot be signed: the email then goes
out without the link or the VERP address, and the worker's log says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.sender_fields import SenderFields, fill_sender
from sendqueue.domain.senders import Sender
from sendqueue.domain.tokens import verp_address
from sendqueue.domain.unsubscribe import personalize
from sendqueue.ports import OutgoingMessage
from sendqueue.services.config import ServiceConfig

__all__ = ["outgoing_message"]

# The worker's logger: these lines are the send worker's (docs/operations.md lists them).
log = logging.getLogger("sendqueue.services.sending.worker")


def outgoing_message(
    config: ServiceConfig,
    campaign: Campaign,
    task: Task,
    sender: Sender | None,
    now: datetime,
    *,
    thread: Mapping[str, str] | None = None,
) -> OutgoingMessage:
    """The email of ``task`` sent at ``now`` from ``sender`` (None: the campaign's From);
    ``thread`` holds a later step's In-Reply-To and References."""
    headers = {"X-Sendqueue-Task": task.id}
    if thread:
        headers.update(thread)
    links = config.unsubscribe
    url = None
    if links is not None:
        try:
            url = links.url(task.id)
            headers.update(links.headers(task.id))
        except InvalidField as exc:  # an id sendqueue did not make: send, and say so
            url = None
            log.error("task %s: sent without an unsubscribe link: %s", task.id, exc)
    reply_to = campaign.reply_to
    fields = SenderFields.of_from(campaign.from_addr)
    if sender is not None:
        fields, reply_to = SenderFields.of_sender(sender), sender.reply_to or reply_to
    signed = fill_sender(task.subject, task.text, task.html, fields)
    parts = personalize(
        signed.subject, signed.text, signed.html, url, footer=campaign.unsubscribe_footer
    )
    return OutgoingMessage(
        message_id=message_id_for(task.id, fields.email, config.secret_key),
        from_addr=fields.email,
        from_name=fields.name,
        reply_to=reply_to,
        to_addr=task.email,
        to_name=task.name,
        subject=parts.subject,
        text=parts.text,
        html=parts.html,
        date=now,
        headers=headers,
        envelope_from=_envelope_from(config, task),
    )


def _envelope_from(config: ServiceConfig, task: Task) -> str | None:
    """The task's VERP bounce address, so a DSN names its task (None: no bounce address
    configured, the From is the envelope sender)."""
    if config.bounce_address is None or config.secret_key is None:
        return None
    try:
        return verp_address(config.bounce_address, task.id, config.secret_key)
    except InvalidField as exc:  # an id sendqueue did not make: send, and say so
        log.error("task %s: sent without a VERP envelope sender: %s", task.id, exc)
        return None
