"""Migration 0012 (a campaign's steps) on a real SQLite file and the real PostgreSQL server:
campaigns stored before it read as having no steps, and its downgrade keeps every row (and
refuses to drop a sequence's later steps)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from sendqueue.adapters.sql import migrate, open_store
from sendqueue.adapters.sql.schema import create_store_engine
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import Campaign, Recipient
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.steps import Step, parse_delay

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
BEFORE = "0011"  # the revision 0012 follows

STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }},\n", None, None),
    Step(2, None, "Any thoughts?\n", None, parse_delay("2d")),
)


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


@pytest.fixture
def engine(url: str) -> Iterator[sa.Engine]:
    made = create_store_engine(url)
    try:
        yield made
    finally:
        made.dispose()


def a_campaign(cid: str, steps: tuple[Step, ...] = ()) -> Campaign:
    return Campaign(
        id=cid, name="n", policy=SendingPolicy(), from_addr="a@example.com", created_at=T0,
        updated_at=T0, steps=steps,
    )  # fmt: skip


def test_campaigns_from_before_read_without_steps_and_new_ones_keep_theirs(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, BEFORE)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO campaigns (id, name, policy, from_addr, state, recipient_count, "
                "created_at, updated_at) VALUES ('old', 'n', :policy, 'a@example.com', 'draft', "
                "0, :at, :at)"
            ),
            {"policy": '{"timezone": "Europe/Berlin"}', "at": T0},
        )

    with open_store(url) as store:  # upgrades on open
        assert migrate.current(url) == migrate.head()
        assert store.get_campaign("old").steps == ()
        store.create_campaign(a_campaign("new", STEPS), [Recipient(0, "r@example.com")])
        assert store.get_campaign("new").steps == STEPS


def test_the_downgrade_drops_the_steps_and_keeps_campaigns_and_recipients(
    url: str, engine: sa.Engine
) -> None:
    with open_store(url) as store:
        store.create_campaign(a_campaign("c1", STEPS[:1]), [Recipient(0, "r@example.com")])
        store.create_campaign(a_campaign("c0"), [])

    migrate.downgrade(url, BEFORE)

    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("campaigns")}
        assert "steps" not in columns
        # batch mode would have copied the table, and its cascade emptied the recipients
        assert conn.execute(sa.text("SELECT count(*) FROM recipients")).scalar_one() == 1
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar_one() == 2


def test_the_downgrade_refuses_while_a_campaign_has_later_steps(url: str) -> None:
    # Its later steps are made only as each step before is sent: none may exist yet (so 0011's
    # own refusal would not see them), and dropping the column would end every such sequence.
    with open_store(url) as store:
        store.create_campaign(a_campaign("c1", STEPS), [Recipient(0, "r@example.com")])

    with pytest.raises(InvalidField) as exc:
        migrate.downgrade(url, BEFORE)

    assert exc.value.field == "revision"
    assert "1 campaign" in exc.value.reason
    assert migrate.current(url) == migrate.head()
    with open_store(url) as store:
        assert store.get_campaign("c1").steps == STEPS
