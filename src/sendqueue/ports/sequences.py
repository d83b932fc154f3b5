"""The store's part in editing a running sequence: its stored steps replaced under a
compare-and-set, and Pending emails of an edited step rendered anew.

Every task store implements :class:`SequenceEdits` (SQL, DynamoDB, memory);
``services/sequences/editing.py`` is handed it with the rest of :class:`LeasedCampaignTasks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sendqueue.domain.steps import Step
from sendqueue.domain.transitions import Rerender
from sendqueue.ports.tasks import LeasedCampaignTasks

__all__ = ["SequenceEdits", "SequenceStore"]


class SequenceEdits(Protocol):
    """Contract:

    - ``replace_steps`` is a compare-and-set on the campaign's stored steps: it writes
      ``steps`` (and ``updated_at = at``) only while they are still ``expected``, so of two
      editors who read the same steps one wins and the other gets False and reads again.
      NotFound for an unknown campaign. The state is not changed and no change-log entry is
      written (the steps are templates, not a state).
    - ``rerender`` applies each :class:`~sendqueue.domain.transitions.Rerender` only while its
      task is Pending and still holds its token (a compare-and-set); it sets the subject, text,
      html and ``updated_at`` only, logs ``Pending -> Pending`` with ``note`` in the same write,
      and returns how many were applied. A task claimed, ended, moved or re-tokened meanwhile is
      left alone.
    """

    def replace_steps(
        self,
        campaign_id: str,
        expected: Sequence[Step],
        steps: Sequence[Step],
        *,
        at: datetime,
    ) -> bool: ...

    def rerender(self, changes: Sequence[Rerender], *, at: datetime, note: str) -> int: ...


class SequenceStore(LeasedCampaignTasks, SequenceEdits, Protocol):
    """What editing a sequence is handed: campaigns, tasks, leases and the two edits."""
