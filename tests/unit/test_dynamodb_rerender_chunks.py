"""DynamoDB's re-render writes: chunks of at most LOG_MAX tasks and about 1 MB of text, so a
transaction stays under DynamoDB's 100 items and 4 MB."""

from __future__ import annotations

from sendqueue.adapters.dynamodb.sequences import _chunks
from sendqueue.adapters.dynamodb.table import LOG_MAX
from sendqueue.domain.transitions import Rerender


def _edit(n: int, chars: int) -> Rerender:
    return Rerender(f"c-{n:04d}", "c", "tok", "s", "x" * chars, None)


def test_many_small_edits_are_cut_at_the_log_items_size_in_id_order() -> None:
    edits = [_edit(n, 10) for n in reversed(range(250))]
    chunks = _chunks(edits)
    assert [len(c) for c in chunks] == [LOG_MAX, LOG_MAX, 250 - 2 * LOG_MAX]
    assert [e.task_id for c in chunks for e in c] == sorted(e.task_id for e in edits)


def test_large_bodies_are_cut_by_their_size_and_one_alone_still_goes() -> None:
    chunks = _chunks([_edit(n, 400_000) for n in range(5)] + [_edit(9, 2_000_000)])
    assert [len(c) for c in chunks] == [2, 2, 1, 1]
    assert chunks[-1][0].task_id == "c-0009"
