"""What the live stream reads: the task store's :class:`ChangeLog` and its
:class:`ChangeSignal`, the ports' own protocols, named here for the web app, which reads through
services and never imports a port."""

from __future__ import annotations

from sendqueue.ports.changes import ChangeSignal
from sendqueue.ports.tasks import ChangeLog

__all__ = ["ChangeLog", "ChangeSignal"]
