"""The feedback mailbox read over IMAP (issue 14): :class:`ImapFeedbackSource`, built from a
``SENDQUEUE_FEEDBACK_IMAP`` URL (:func:`parse_imap_url`)."""

from __future__ import annotations

from sendqueue.adapters.imap.source import ImapFeedbackSource
from sendqueue.adapters.imap.url import ImapUrl, parse_imap_url

__all__ = ["ImapFeedbackSource", "ImapUrl", "parse_imap_url"]
