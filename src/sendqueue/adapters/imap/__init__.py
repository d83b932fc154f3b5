"""The feedback mailboxes read over IMAP: :class:`ImapFeedbackSource`, built from the
``SENDQUEUE_FEEDBACK_IMAP`` URL or a sender's ``imap`` URL (:func:`parse_imap_url`)."""

from __future__ import annotations

from sendqueue.adapters.imap.source import ImapFeedbackSource
from sendqueue.adapters.imap.url import ImapUrl, parse_imap_url

__all__ = ["ImapFeedbackSource", "ImapUrl", "parse_imap_url"]
