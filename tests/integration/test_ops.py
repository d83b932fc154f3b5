"""sendqueue.ops.migrate_to checks its target itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.ops.migrate_to import migrate_to
from sendqueue.services.scheduling import ScheduleWriter
from sendqueue.testing import FakeClock, FakeScheduler, InMemoryTaskStore


def test_migrate_to_refuses_a_target_that_is_not_a_sql_store(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with pytest.raises(InvalidField, match="PostgreSQL"):
        migrate_to(f"sqlite:///{tmp_path / 'store.db'}", InMemoryTaskStore(), writer, clock)
