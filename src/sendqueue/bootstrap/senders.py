"""The composition root's part for senders: their service, with the adapters' own checks of
what a sender may name, and each sender's mailer (its transport under the transport rules,
signed in with XOAUTH2 when it has a grant). Apart from :mod:`sendqueue.bootstrap` only to keep
each module short; the container's ``senders`` and ``sender_mailers`` are the way in."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from sendqueue.adapters.imap.url import MAX_SENDER_TIMEOUT, check_imap_url
from sendqueue.adapters.mail.factory import SenderMailers, check_sender_transport
from sendqueue.adapters.oauth import check_token_url
from sendqueue.services.senders.service import SenderService

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = ["sender_mailers", "sender_service"]


def sender_service(c: Container) -> SenderService:
    """Senders as the CLI, the API and the pages act on them; a transport, a mailbox or a
    token endpoint the worker or the poll would refuse is refused when it is written."""
    rules = c.settings.transport_rules
    return SenderService(
        c.sender_store,
        c.clock,
        default_timezone=c.config.default_timezone,
        check_transport=partial(check_sender_transport, rules=rules, configured=c.settings.mailer),
        check_imap=partial(
            check_imap_url, rules=rules, field="imap", max_timeout=MAX_SENDER_TIMEOUT
        ),
        check_token_url=check_token_url,
    )


def sender_mailers(c: Container) -> SenderMailers:
    """Each sender's mailer (see :class:`SenderMailers`); a test container's mailer, when it
    was built with one, carries every allowed sender's mail."""
    return SenderMailers(
        lambda: c.mailer,
        c.settings.mailer,
        c.oauth_tokens,
        c.settings.transport_rules,
        shared=c.injected_mailer,
    )
