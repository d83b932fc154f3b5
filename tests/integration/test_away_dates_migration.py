"""Migration 0013 (recipients' return dates) on a real SQLite file and the real PostgreSQL
server: a 0012 store upgrades with its campaigns kept and keeps return dates after; the
downgrade drops the table and nothing else."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from sendqueue.adapters.sql import migrate, open_store
from sendqueue.adapters.sql.schema import create_store_engine
from sendqueue.domain.models import Campaign, Recipient
from sendqueue.domain.policy import SendingPolicy

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
BEFORE = "0012"  # the revision 0013 follows


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    value: str = request.getfixturevalue("postgres_url")
    return value


def _campaign(cid: str) -> Campaign:
    return Campaign(
        id=cid, name="n", policy=SendingPolicy(), from_addr="a@example.com", created_at=T0,
        updated_at=T0,
    )  # fmt: skip


def test_a_0012_store_upgrades_and_keeps_return_dates_then_downgrades(url: str) -> None:
    migrate.upgrade(url, BEFORE)
    with open_store(url) as store:  # upgrades on open
        assert migrate.current(url) == migrate.head() == "0014"
        store.create_campaign(_campaign("c1"), [Recipient(0, "r@example.com")])
        store.set_away("c1", 0, date(2026, 12, 14), at=T0)
        assert store.away_until("c1", 0) == date(2026, 12, 14)

    migrate.downgrade(url, BEFORE)

    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            assert "away_dates" not in sa.inspect(conn).get_table_names()
            assert conn.execute(sa.text("SELECT id FROM campaigns")).scalar_one() == "c1"
            assert conn.execute(sa.text("SELECT count(*) FROM recipients")).scalar_one() == 1
    finally:
        engine.dispose()
