"""sendqueue.ops: the schema upgrade of ``db upgrade`` and migrate-to's target check."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.adapters import migrate
from sendqueue.domain.errors import InvalidField
from sendqueue.ops.migrate_to import migrate_to
from sendqueue.ops.schema import SchemaVersions, upgrade_database
from sendqueue.services.scheduling import ScheduleWriter
from sendqueue.testing import FakeClock, FakeScheduler, InMemoryTaskStore


def test_upgrading_a_sqlite_store_reaches_head_and_twice_is_a_no_op(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert upgrade_database(url) == SchemaVersions(migrate.head(), None)
    assert upgrade_database(url) == SchemaVersions(migrate.head(), None)


@pytest.mark.postgres
def test_upgrading_for_procrastinate_installs_its_schema_too(postgres_url: str) -> None:
    versions = upgrade_database(postgres_url, procrastinate=True)
    assert versions.store == migrate.head()
    assert versions.procrastinate


def test_migrate_to_refuses_a_target_that_is_not_a_sql_store(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with pytest.raises(InvalidField, match="PostgreSQL"):
        migrate_to(f"sqlite:///{tmp_path / 'store.db'}", InMemoryTaskStore(), writer, clock)
