"""Feedback parsed in a child process, each message within a time budget:
:class:`IsolatedParser`."""

from __future__ import annotations

from sendqueue.adapters.parser.process import IsolatedParser

__all__ = ["IsolatedParser"]
