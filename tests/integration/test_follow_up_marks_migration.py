"""Migration 0014 (follow-up marks) on a real SQLite file and the real PostgreSQL server: a
0013 store upgrades with its tasks kept, a step recorded sent before it reads back unmarked and
a finish after it marks its step; the downgrade drops the column and its index and nothing
else."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from sendqueue.adapters.sql import migrate, open_store
from sendqueue.adapters.sql.schema import create_store_engine
from sendqueue.domain.lifecycle import TaskState

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
BEFORE = "0013"  # the revision 0014 follows


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


def _stored_at_0013(engine: sa.Engine) -> None:
    """A campaign with a step 1 recorded sent (position 0) and one being sent (position 1),
    written with 0013's columns."""
    task = (
        "INSERT INTO tasks (id, campaign_id, position, email, name, subject, text, send_at, "
        "state, token, attempts, claimed_at, sent_at, message_id, created_at, updated_at) "
        "VALUES (:id, 'c1', :position, :email, '', 's', 't', :at, :state, :token, 1, :at, "
        ":sent_at, :message_id, :at, :at)"
    )
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO campaigns (id, name, policy, from_addr, state, recipient_count, "
                "created_at, updated_at) VALUES ('c1', 'n', '{}', 'a@example.com', 'active', "
                "2, :at, :at)"
            ),
            {"at": T0},
        )
        conn.execute(
            sa.text(task),
            [
                {"id": "c1-0", "position": 0, "email": "a@example.com", "state": "Finished",
                 "token": "t0", "at": T0, "sent_at": T0, "message_id": "<m0@example.com>"},
                {"id": "c1-1", "position": 1, "email": "b@example.com", "state": "Running",
                 "token": "t1", "at": T0, "sent_at": None, "message_id": None},
            ],
        )  # fmt: skip


def test_a_0013_store_upgrades_unmarked_and_marks_a_finish_after(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, BEFORE)
    _stored_at_0013(engine)

    with open_store(url) as store:  # upgrades on open
        assert migrate.current(url) == migrate.head() == "0014"
        sent = store.get_task("c1-0")
        assert sent is not None and sent.state is TaskState.FINISHED
        assert store.follow_ups_due("c1") == []  # a send from before is found by the sweep
        at = T0 + timedelta(minutes=1)
        done = store.finish_send("c1-1", at=at, message_id="<m1@example.com>", follow_up=True)
        assert done.task is not None and done.task.state is TaskState.FINISHED
        assert [t.id for t in store.follow_ups_due("c1")] == ["c1-1"]


def _column_and_index(engine: sa.Engine) -> tuple[bool, bool]:
    """Whether the tasks table has the ``follow_up`` column, and its index."""
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        columns = {c["name"] for c in inspector.get_columns("tasks")}
        indexes = {i["name"] for i in inspector.get_indexes("tasks")}
    return "follow_up" in columns, "ix_tasks_follow_up" in indexes


def test_the_downgrade_drops_the_marks_column_and_index_and_keeps_the_tasks(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, BEFORE)
    _stored_at_0013(engine)
    with open_store(url) as store:
        store.finish_send("c1-1", at=T0, message_id="<m1@example.com>", follow_up=True)
        assert len(store.follow_ups_due("c1")) == 1
    assert _column_and_index(engine) == (True, True)

    migrate.downgrade(url, BEFORE)

    assert migrate.current(url) == BEFORE
    assert _column_and_index(engine) == (False, False)
    with engine.connect() as conn:
        states = conn.execute(sa.text("SELECT id, state FROM tasks ORDER BY id")).all()
        assert [tuple(row) for row in states] == [("c1-0", "Finished"), ("c1-1", "Finished")]
