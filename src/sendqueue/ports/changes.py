"""The :class:`ChangeSignal` port: word that the change log may have grown, so that a reader of
it (the live stream's) is woken on commit instead of polling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["ChangeSignal"]


class ChangeSignal(Protocol):
    """Wakes readers of a task store's change log when it may have grown.

    Contract: after ``unsubscribe = subscribe(wake)``, ``wake()`` is called at least once after
    each commit that appended change-log entries, as soon as the adapter learns of it, until
    ``unsubscribe()`` is called. ``wake`` runs on any thread and must return at once without
    raising. It may be called when nothing changed (a reader re-reads by position, so a
    spurious wake costs one read). When the adapter cannot hear commits for a while (its
    connection to the database dropped), it calls ``wake`` again once it hears them again, so a
    reader catches up on what was committed in between. Readers keep a slow poll besides: a
    signal says "read now", never "nothing to read".
    """

    settles_late: bool
    """True when an entry can stay out of ``changes_after`` for a while after the signal of
    its commit (PostgreSQL: behind an older transaction still in flight). A reader then
    compares ``newest_change_id()`` with its position after each read, and reads again soon
    while behind, since the commit that lets the entry through may signal nothing."""

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]: ...
