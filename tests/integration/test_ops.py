"""sendqueue.ops.migrate_to checks its target itself, and carries the counters over."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.adapters.sql import open_store
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.suppression import Suppression, SuppressionReason
from sendqueue.ops.migrate_to import migrate_to
from sendqueue.services.scheduling import ScheduleWriter
from sendqueue.testing import FakeClock, FakeScheduler, InMemoryTaskStore
from tests.support.app import T0


def test_migrate_to_refuses_a_target_that_is_not_a_sql_store(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with pytest.raises(InvalidField, match="PostgreSQL"):
        migrate_to(f"sqlite:///{tmp_path / 'store.db'}", InMemoryTaskStore(), writer, clock)


@pytest.mark.postgres
def test_migrate_to_keeps_the_session_generation(tmp_path: Path, postgres_url: str) -> None:
    # A logout on the old store must not be undone by the move: the old cookies stay refused.
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(source_url) as source:
        source.increment_counter("session-generation")
        source.increment_counter("session-generation")
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        target.increment_counter("session-generation")  # a lower value there loses
        migrate_to(source_url, target, writer, clock)
        assert target.counter("session-generation") == 2


@pytest.mark.postgres
def test_migrate_to_carries_the_suppression_list_over(tmp_path: Path, postgres_url: str) -> None:
    # A move must never make a suppressed address sendable again.
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    listed = [
        Suppression(f"s{i}@example.com", SuppressionReason.BOUNCED, f"c1-{i}", T0) for i in range(7)
    ]
    with open_store(source_url) as source:
        assert source.suppress(listed) == 7
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        kept = Suppression("s0@example.com", SuppressionReason.MANUAL, None, T0)
        assert target.suppress([kept]) == 1  # listed there already: it keeps its own entry
        report = migrate_to(source_url, target, writer, clock, batch=3)
        assert report.suppressions == 6
        assert target.list_suppressions(limit=100) == [kept, *listed[1:]]
