"""EmbeddedScheduler.create_many (the bulk write provisioning uses): one result per item, as
``create`` would have given, whether the batch is all new names (one INSERT, no lookup) or
holds existing and repeated ones (looked up first)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.testing.clock import FakeClock
from tests.support.app import T0

AT = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)  # 09:00 in Berlin


def _item(name: str, token: str) -> tuple[str, str, datetime, str, dict[str, str], str, int]:
    return (name, "sq-c1", AT, "Europe/Berlin", {"kind": "send", "task_id": name}, token, 2)


def _create(scheduler: EmbeddedScheduler, name: str, token: str) -> None:
    """``create`` of what :func:`_item` asks for: its wall time in Berlin."""
    wall = datetime(2026, 12, 1, 9, 0)
    scheduler.create(name, "sq-c1", wall, "Europe/Berlin", _item(name, token)[4], token, 2)


@pytest.fixture
def scheduler(tmp_path: Path) -> EmbeddedScheduler:
    return EmbeddedScheduler(f"sqlite:///{tmp_path / 's.db'}", clock=FakeClock(T0))


def test_all_new_names_are_created_in_order(scheduler: EmbeddedScheduler) -> None:
    items = [_item(f"n-{i}", f"t{i}") for i in range(1200)]
    out = scheduler.create_many(items)
    assert out == [None] * 1200
    assert [s.name for s in scheduler.list("sq-c1", limit=2000)] == sorted(
        f"n-{i}" for i in range(1200)
    )
    stored = scheduler.get("n-7")
    assert stored is not None and (stored.client_token, stored.payload) == (
        "t7", {"kind": "send", "task_id": "n-7"}
    )  # fmt: skip
    assert (stored.due_at, stored.at_local) == (AT, datetime(2026, 12, 1, 9, 0))
    assert len(scheduler.list("sq-c1", limit=2000)) == 1200


def test_existing_and_repeated_names_answer_as_create_would(
    scheduler: EmbeddedScheduler,
) -> None:
    _create(scheduler, "old-same", "a")
    _create(scheduler, "old-other", "a")
    out = scheduler.create_many(
        [
            _item("new-1", "x"),
            _item("old-same", "a"),  # same token: the existing schedule
            _item("old-other", "b"),  # another token: Conflict, returned
            _item("new-1", "x"),  # repeated in the batch, same token: the one just made
            _item("new-1", "y"),  # repeated, another token: Conflict
            _item("new-2", "z"),
        ]
    )
    kinds = ["ok" if r is None else type(r).__name__ for r in out]
    assert kinds == ["ok", "ok", "Conflict", "ok", "Conflict", "ok"]
    same = scheduler.get("old-same")
    assert same is not None and same.client_token == "a"
    new = scheduler.get("new-1")
    assert new is not None and new.client_token == "x"  # the first of the repeated name
    assert isinstance(out[2], Conflict) and "old-other" in str(out[2])
    names = sorted(s.name for s in scheduler.list("sq-c1"))
    assert names == ["new-1", "new-2", "old-other", "old-same"]
    other = scheduler.get("old-other")
    assert other is not None and other.client_token == "a"  # the conflict changed nothing


def test_a_batch_with_one_existing_name_writes_the_new_ones_once(
    scheduler: EmbeddedScheduler,
) -> None:
    _create(scheduler, "n-3", "t3")
    out = scheduler.create_many([_item(f"n-{i}", f"t{i}") for i in range(6)])
    assert out == [None] * 6
    assert sorted(s.name for s in scheduler.list("sq-c1")) == [f"n-{i}" for i in range(6)]


def test_an_invalid_item_writes_nothing(scheduler: EmbeddedScheduler) -> None:
    bad = ("n-1", "sq-c1", AT, "Europe/Berlin", {"kind": "send"}, "bad token!", 2)
    with pytest.raises(InvalidField, match="client_token"):
        scheduler.create_many([_item("n-0", "t0"), bad])
    assert scheduler.list("sq-c1") == []
