"""The store's part in sequences: the sent steps whose next step is still to be made
(:class:`FollowUpMarks`), and editing a running sequence (its stored steps replaced under a
compare-and-set, and Pending emails of an edited step rendered anew).

Every task store implements both (SQL, DynamoDB, memory); ``services/sequences/`` is handed
them with the rest of :class:`LeasedCampaignTasks`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol

from sendqueue.domain.models import Task
from sendqueue.domain.steps import Step
from sendqueue.domain.transitions import Rerender
from sendqueue.ports.tasks import LeasedCampaignTasks

__all__ = ["FollowUpMarks", "FollowUpStore", "SequenceEdits", "SequenceStore"]


class FollowUpMarks(Protocol):
    """Contract: a task finished with ``finish_send(follow_up=True)`` is *marked*: its
    recipient's next step is still to be made. The mark is durable (written with the finish),
    so a worker that dies before making the step leaves it for the next pass to find.

    - ``follow_ups_due`` returns up to ``limit`` marked tasks of the campaign as they are now
      (their outcome may have changed since), in (position, step) order; empty for an unknown
      campaign.
    - ``follow_ups_made`` clears the marks of those of ``task_ids`` that are marked in the
      campaign and returns how many it cleared; clearing twice is harmless.
    - While a campaign has a marked task, ``has_unfinished_tasks`` is True: the campaign is not
      done while a sequence's next step waits to be made.
    """

    def follow_ups_due(self, campaign_id: str, *, limit: int = 500) -> list[Task]: ...

    def follow_ups_made(self, campaign_id: str, task_ids: Collection[str]) -> int: ...


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


class SequenceStore(LeasedCampaignTasks, SequenceEdits, FollowUpMarks, Protocol):
    """What editing a sequence is handed: campaigns, tasks, leases and the two edits."""


class FollowUpStore(LeasedCampaignTasks, FollowUpMarks, Protocol):
    """What making follow-ups is handed: campaigns, tasks, leases and the marks."""
