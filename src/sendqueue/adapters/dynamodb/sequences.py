"""The sequence edits on DynamoDB (:class:`~sendqueue.ports.SequenceEdits`).

The steps live in the campaign item: :meth:`replace_steps` is the campaign's conditional Put
(on the item as read), after the stored steps are compared with the expected ones. A
re-rendered task is a conditional Put on its state and version as read (so its token too),
with its log item, a few tasks a transaction: a transaction holds at most 4 MB, and a task's
bodies can be large.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sendqueue.adapters.dynamodb.codec import (
    PendingEntry,
    campaign_item,
    item_size,
    task_from_item,
)
from sendqueue.adapters.dynamodb.table import ITEM_BYTES, LOG_MAX
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, utc
from sendqueue.domain.steps import Step, check_steps
from sendqueue.domain.transitions import Rerender

__all__ = ["SequenceItems"]

#: Stands for the campaign item's recipient key (16 hex digits) when its size is measured.
_SIZED_KEY = "0" * 16
#: The most characters of bodies and subjects one transaction writes (of its 4 MB).
_CHUNK_CHARS = 1_000_000


def _chunks(changes: Sequence[Rerender]) -> list[list[Rerender]]:
    """``changes`` in id order, cut so no chunk passes LOG_MAX tasks or _CHUNK_CHARS."""
    chunks: list[list[Rerender]] = []
    size = 0
    for change in sorted(changes, key=lambda r: r.task_id):
        chars = len(change.subject) + len(change.text) + len(change.html or "")
        if not chunks or len(chunks[-1]) >= LOG_MAX or (size + chars > _CHUNK_CHARS and size):
            chunks.append([])
            size = 0
        chunks[-1].append(change)
        size += chars
    return chunks


class SequenceItems:
    """``replace_steps`` and ``rerender`` of
    :class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`."""

    def replace_steps(
        self, campaign_id: str, expected: Sequence[Step], steps: Sequence[Step], *, at: datetime
    ) -> bool:
        me: Any = self
        checked, wanted, at = check_steps(steps), tuple(expected), utc(at)

        def change(current: Campaign) -> tuple[Campaign, PendingEntry | None] | None:
            if current.steps != wanted:
                return None
            updated = replace(current, steps=checked, updated_at=at)
            if item_size(campaign_item(updated, _SIZED_KEY)) > ITEM_BYTES:
                # refused as create_campaign refuses it: DynamoDB's own refusal reads as an outage
                changed = next(
                    (s.number for s, old in zip(checked, wanted, strict=False) if s != old),
                    len(checked),
                )
                raise InvalidField(
                    f"steps[{changed}]", len(checked),
                    "with the other steps, larger than a DynamoDB item can be (400 KB)",
                )  # fmt: skip
            return updated, None

        with me._errors("replace a campaign's steps"):
            return bool(me._campaign_write(campaign_id, change))

    def rerender(self, changes: Sequence[Rerender], *, at: datetime, note: str) -> int:
        me: Any = self
        at = utc(at)
        pending = TaskState.PENDING.value
        applied = 0
        with me._errors("re-render tasks"):
            for chunk in _chunks(changes):
                by_key = {f"T#{c.task_id}": c for c in chunk}
                count = 0

                def build(
                    by_key: dict[str, Rerender] = by_key,
                ) -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
                    nonlocal count
                    writes: list[dict[str, Any]] = []
                    entries: list[PendingEntry] = []
                    for item in me._batch_get([(k, "#") for k in by_key]):
                        task, version = task_from_item(item)
                        edit = by_key[str(item["pk"]["S"])]
                        if task.state is not TaskState.PENDING or task.token != edit.token:
                            continue
                        new = replace(
                            task, subject=edit.subject, text=edit.text, html=edit.html,
                            updated_at=at,
                        )  # fmt: skip
                        writes.append(me._task_put(new, TaskState.PENDING, version))
                        entries.append((task.campaign_id, task.id, pending, pending, at, note))
                    count = len(writes)
                    return (writes, entries) if writes else None

                if me._with_log(build):
                    applied += count
        return applied
