"""The composition root's part for the feedback loop: the feedback service, the feedback
mailbox (``SENDQUEUE_FEEDBACK_IMAP``), the senders' own mailboxes and the poller that reads
them all. Apart from :mod:`sendqueue.bootstrap` only to keep each module short; the
container's ``feedback``, ``feedback_sources``, ``mailboxes`` and ``feedback_poller`` are the
way in."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from sendqueue.adapters.parser import IsolatedParser
from sendqueue.bootstrap import campaigns as bootstrap_campaigns
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.reports import parse_feedback
from sendqueue.domain.senders import Sender
from sendqueue.ports import FeedbackSource
from sendqueue.services.feedback.effects import FeedbackService
from sendqueue.services.feedback.mailboxes import SenderMailboxes, url_secrets
from sendqueue.services.feedback.poll import FeedbackPoller
from sendqueue.services.feedback.unsubscribe import UnsubscribeService

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = [
    "feedback_poller",
    "feedback_service",
    "feedback_sources",
    "open_sender_mailbox",
    "sender_mailboxes",
    "unsubscribe_service",
]


def open_sender_mailbox(c: Container, sender: Sender) -> FeedbackSource:
    """The one factory of a sender's mailbox source, from its ``imap`` URL under the transport
    rules, signed in with XOAUTH2 when the sender has an OAuth grant. Opens nothing; a
    malformed or refused URL raises InvalidField naming ``imap``."""
    if sender.imap is None:
        raise InvalidField("imap", None, "the sender has no mailbox")
    from sendqueue.adapters.imap import ImapFeedbackSource

    rules = c.settings.transport_rules
    return ImapFeedbackSource.for_sender(sender, c.oauth_tokens, rules=rules)


def feedback_service(c: Container) -> FeedbackService:
    """Applies bounces, complaints, replies and unsubscribes (the task store keeps what it
    needs); the schedules of the tasks it cancels are deleted through the writer."""
    return FeedbackService(
        c.stores.tasks,
        c.stores.feedback,
        c.suppressions,
        c.clock,
        senders=c.sender_store,
        # lazy: the scheduler is opened only when a cancel has schedules to delete
        delete_schedules=lambda names: c.writer.delete_many(names),
        suppress_replies=c.settings.suppress_replies,
        # lazy: the re-planner is built only when an out-of-office notice names a date
        postpone=lambda tasks, back: bootstrap_campaigns.away_dates(c).postpone(tasks, back),
        steps_missing=lambda cid: c.followups.missing_made(cid, now=c.clock.now()),
    )


def unsubscribe_service(c: Container) -> UnsubscribeService:
    """Checks the links of /u/<token> and applies them through the feedback service."""
    s = c.stores
    return UnsubscribeService(
        c.config.unsubscribe, s.campaigns, s.suppressions, c.feedback, c.clock, senders=s.senders
    )


def feedback_sources(c: Container) -> list[FeedbackSource]:
    """The feedback mailbox, SENDQUEUE_FEEDBACK_IMAP (none when it is unset); the senders'
    own mailboxes are :func:`sender_mailboxes`, read from the store at each pass."""
    if c.settings.feedback_imap is None:
        return []
    from sendqueue.adapters.imap import ImapFeedbackSource

    return [ImapFeedbackSource.from_url(c.settings.feedback_imap)]


def sender_mailboxes(c: Container) -> SenderMailboxes:
    """The senders' mailboxes, their sources made by ``open_mailbox`` (given to
    :func:`~sendqueue.bootstrap.bootstrap`, else :func:`open_sender_mailbox`)."""
    return SenderMailboxes(
        c.sender_store,
        c.stores.cursors,
        c.open_mailbox or partial(open_sender_mailbox, c),
    )


def feedback_poller(c: Container) -> FeedbackPoller:
    """Reads the feedback mailbox and every sender's; parses in a child process within
    SENDQUEUE_FEEDBACK_PARSE_SECONDS per message (in this process only with a parser the
    caller injected, as tests do)."""
    seconds = c.settings.feedback_parse_seconds
    return FeedbackPoller(
        c.stores.leases,
        c.stores.cursors,
        c.feedback,
        c.feedback_sources,
        c.parse_feedback or IsolatedParser(parse_feedback, seconds=seconds),
        c.clock,
        c.config,
        mailboxes=c.mailboxes.current,
        source_secrets=url_secrets(c.settings.feedback_imap),
    )
