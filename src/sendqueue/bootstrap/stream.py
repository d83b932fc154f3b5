"""The composition root's part of the live stream: what wakes its reader on commit."""

from __future__ import annotations

from sendqueue.adapters.sql import SqlTaskStore
from sendqueue.ports import TaskStore
from sendqueue.ports.changes import ChangeSignal

__all__ = ["change_signal"]


def change_signal(store: TaskStore) -> ChangeSignal | None:
    """The SQL stores' own signal. Any other store (DynamoDB, or a wrapper or fake given to
    ``bootstrap``) brings none: its streams poll."""
    return store.change_signal if isinstance(store, SqlTaskStore) else None
