"""The SQL task store's database set-up: Alembic migrations, engine settings, many processes.

Runs on a real SQLite file and on the real PostgreSQL server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from sendqueue.adapters.sql import migrate, open_store
from sendqueue.adapters.sql.schema import create_store_engine, metadata
from sendqueue.domain.errors import InvalidField, StoreUnavailable
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, task_id
from sendqueue.domain.policy import SendingPolicy
from sendqueue.testing.tasks import bare_task

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
TABLES = set(metadata.tables)


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


def schema_diffs(engine: sa.Engine) -> list[object]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        return list(compare_metadata(context, metadata))


def table_names(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names())


def a_campaign(cid: str = "c1") -> Campaign:
    return Campaign(
        id=cid, name="n", policy=SendingPolicy(), from_addr="a@example.com", created_at=T0
    )


def test_upgrade_head_on_an_empty_database_matches_the_metadata(
    url: str, engine: sa.Engine
) -> None:
    assert migrate.current(url) is None
    assert not TABLES & table_names(engine)

    migrate.upgrade(url)

    assert migrate.current(url) == migrate.head()
    assert table_names(engine) >= TABLES
    assert schema_diffs(engine) == []


def test_the_comparison_notices_a_schema_that_drifted(url: str, engine: sa.Engine) -> None:
    # Guards the test above: an empty diff must mean "same schema", not "nothing compared".
    migrate.upgrade(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX ix_tasks_state_claimed_at"))

    diffs = schema_diffs(engine)

    assert len(diffs) == 1
    assert "ix_tasks_state_claimed_at" in repr(diffs)


def test_upgrading_twice_is_a_no_op(url: str, engine: sa.Engine) -> None:
    migrate.upgrade(url)
    with open_store(url, upgrade=False) as store:
        store.create_campaign(a_campaign(), [])

    migrate.upgrade(url)

    assert migrate.current(url) == migrate.head()
    assert schema_diffs(engine) == []
    with open_store(url) as store:
        assert store.get_campaign("c1").id == "c1"


def test_a_0001_database_upgrades_to_counters_and_keeps_its_data(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, "0001")
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO leases (name, owner, expires_at) VALUES ('l', 'a', :at)"),
            {"at": T0},
        )
    assert "counters" not in table_names(engine)

    with open_store(url) as store:  # the store upgrades on open, as after a release
        assert migrate.current(url) == migrate.head() == "0014"
        assert schema_diffs(engine) == []
        assert store.counter("session-generation") == 0
        assert store.increment_counter("session-generation") == 1
        assert not store.acquire_lease("l", "b", ttl_seconds=1, at=T0 - timedelta(seconds=5))
    migrate.downgrade(url, "0001")
    assert "counters" not in table_names(engine)
    assert "leases" in table_names(engine)


def test_a_0002_database_upgrades_to_task_moves_and_keeps_its_tasks(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, "0002")
    send_at = T0 + timedelta(hours=1)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO campaigns (id, name, policy, from_addr, state, recipient_count,"
                " created_at, updated_at) VALUES ('c1', 'C', :policy, 'a@example.com', 'active',"
                " 1, :at, :at)"
            ),
            {"policy": json.dumps(SendingPolicy().to_dict()), "at": T0},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tasks (id, campaign_id, position, email, name, subject, text,"
                " send_at, state, token, attempts, created_at, updated_at) VALUES ('c1-0', 'c1',"
                " 0, 'r@example.com', '', 's', 't', :send_at, 'Pending', 'tok', 0, :at, :at)"
            ),
            {"send_at": send_at, "at": T0},
        )

    with open_store(url) as store:
        assert migrate.current(url) == migrate.head()
        assert schema_diffs(engine) == []
        task = store.get_task("c1-0")
        assert task is not None
        assert (task.planned_at, task.moves, task.moved_reason) == (send_at, 0, None)
        assert task.reason is None  # 0005: nobody said why
        assert store.count_suppressions() == 0
    migrate.downgrade(url, "0004")
    assert "suppressions" not in table_names(engine)
    assert "reason" not in {c["name"] for c in sa.inspect(engine).get_columns("tasks")}
    migrate.downgrade(url, "0002")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("tasks")}
    assert not columns & {"planned_at", "moves", "moved_reason"}


def test_a_0005_database_upgrades_to_feedback_with_address_keys_for_its_tasks(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, "0005")
    # More tasks than one backfill batch (0006's _BATCH), with addresses whose compared form
    # is not SQL's lower(): casefold turns "ß" into "ss".
    emails = ["Straße@Example.com", "Ünïcode.Ĳ@example.com"] + [
        f"User{i}@Example.com" for i in range(2, 2600)
    ]
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO campaigns (id, name, policy, from_addr, state, recipient_count,"
                " created_at, updated_at) VALUES ('c1', 'C', :policy, 'a@example.com', 'active',"
                " :n, :at, :at)"
            ),
            {"policy": json.dumps(SendingPolicy().to_dict()), "at": T0, "n": len(emails)},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tasks (id, campaign_id, position, email, name, subject, text,"
                " send_at, state, token, attempts, sent_at, created_at, updated_at, planned_at,"
                " moves) VALUES (:id, 'c1', :p, :email, '', 's', 't', :at, :state, 'tok', 0,"
                " :sent, :at, :at, :at, 0)"
            ),
            [
                {
                    "id": task_id("c1", p),
                    "p": p,
                    "email": email,
                    "at": T0,
                    "state": "Finished" if p == 0 else "Pending",
                    "sent": T0 if p == 0 else None,
                }
                for p, email in enumerate(emails)
            ],
        )

    with open_store(url) as store:  # upgrades on open, as after a release
        assert migrate.current(url) == migrate.head() == "0014"
        assert schema_diffs(engine) == []
        old = store.get_campaign("c1")
        assert (old.stop_on_reply.value, old.unsubscribe_footer) == ("sender", False)
        sent = store.get_task("c1-0")
        assert sent is not None
        assert (sent.outcome, sent.outcome_detail, sent.outcome_at) == (None, None, None)
        # Every existing row has its key, the last batch's too.
        assert [t.id for t in store.tasks_for("strasse@example.com", states=list(TaskState))] == [
            "c1-0"
        ]
        assert [
            t.id for t in store.tasks_for("ünïcode.ĳ@example.com", states=[TaskState.PENDING])
        ] == ["c1-1"]
        assert [
            t.id for t in store.tasks_for("user2599@example.com", states=[TaskState.PENDING])
        ] == ["c1-2599"]
        with engine.connect() as conn:
            missing = conn.execute(sa.text("SELECT count(*) FROM tasks WHERE email_key IS NULL"))
            assert missing.scalar_one() == 0
        # The feedback loop works on the old rows.
        bounced = store.set_outcome("c1-0", TaskOutcome.BOUNCED, detail="5.1.1", at=T0)
        assert bounced is not None and bounced.outcome is TaskOutcome.BOUNCED
        assert store.count_outcomes("c1") == {TaskOutcome.BOUNCED: 1}
        assert store.record_soft_bounce("a@example.com", "k", at=T0, since=T0) == 1
        store.save_feedback_cursor("box", 1, 5)
        assert store.feedback_cursor("box") == (1, 5)

    migrate.downgrade(url, "0005")
    assert not {"soft_bounces", "feedback_cursors"} & table_names(engine)
    task_columns = {c["name"] for c in sa.inspect(engine).get_columns("tasks")}
    assert not task_columns & {"outcome", "outcome_detail", "outcome_at", "email_key"}
    with engine.connect() as conn:
        # Dropping the campaign columns kept the campaign, and its tasks (no table copy).
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar_one() == 1
        assert conn.execute(sa.text("SELECT count(*) FROM tasks")).scalar_one() == len(emails)
    migrate.upgrade(url)
    assert schema_diffs(engine) == []


def test_a_0010_database_upgrades_to_task_steps_and_its_tasks_read_as_step_one(
    url: str, engine: sa.Engine
) -> None:
    migrate.upgrade(url, "0010")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO campaigns (id, name, policy, from_addr, state, recipient_count,"
                " created_at, updated_at) VALUES ('c1', 'C', :policy, 'a@example.com', 'active',"
                " 2, :at, :at)"
            ),
            {"policy": json.dumps(SendingPolicy().to_dict()), "at": T0},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tasks (id, campaign_id, position, email, name, subject, text,"
                " send_at, state, token, attempts, created_at, updated_at, planned_at, moves,"
                " email_key) VALUES (:id, 'c1', :p, :email, '', 's', 't', :at, 'Pending',"
                " :token, 0, :at, :at, :at, 0, :key)"
            ),
            [
                {"id": task_id("c1", p), "p": p, "email": f"r{p}@example.com", "at": T0}
                | {"token": f"tok{p}", "key": f"r{p}@example.com"}
                for p in range(2)
            ],
        )

    with open_store(url) as store:  # upgrades on open, as after a release
        assert migrate.current(url) == migrate.head() == "0014"
        assert schema_diffs(engine) == []
        old = store.get_task("c1-0")
        assert old is not None and old.step == 1
        assert [t.step for t in store.get_tasks(["c1-0", "c1-1"]).values()] == [1, 1]
        # The old rows' recipients take a task per later step; a step's id stays unique.
        later = replace(bare_task("c1", 0, T0), id=task_id("c1", 0, 2), step=2)
        assert store.insert_tasks([later, replace(later, id="c1-x")], at=T0) == 1
        assert [t.id for t in store.list_tasks("c1", step=1)] == ["c1-0", "c1-1"]
        assert [t.id for t in store.list_tasks("c1", step=2)] == ["c1-0-s2"]

    with pytest.raises(InvalidField, match="1 tasks belong to a step after the first"):
        migrate.downgrade(url, "0010")
    assert migrate.current(url) == migrate.head()  # refused whole: nothing downgraded
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM tasks WHERE step > 1"))
    migrate.downgrade(url, "0010")
    assert "step" not in {c["name"] for c in sa.inspect(engine).get_columns("tasks")}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM tasks")).scalar_one() == 2
    migrate.upgrade(url)
    assert schema_diffs(engine) == []


def test_downgrade_to_base_drops_everything(url: str, engine: sa.Engine) -> None:
    migrate.upgrade(url)
    with open_store(url, upgrade=False) as store:
        store.create_campaign(a_campaign(), [])

    migrate.downgrade(url, "base")

    assert migrate.current(url) is None
    # Only Alembic's own (now empty) version table may remain.
    assert table_names(engine) <= {"alembic_version", "sqlite_sequence"}
    migrate.upgrade(url)
    assert schema_diffs(engine) == []
    with open_store(url) as store:
        assert store.list_campaigns() == []


def test_concurrent_upgrades_of_an_empty_database_both_succeed(url: str, engine: sa.Engine) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        barrier.wait()
        try:
            migrate.upgrade(url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert migrate.current(url) == migrate.head()
    assert schema_diffs(engine) == []


def test_the_store_upgrades_itself_on_open_unless_told_not_to(url: str) -> None:
    with open_store(url, upgrade=False) as store, pytest.raises(StoreUnavailable):
        store.list_campaigns()
    assert migrate.current(url) is None

    with open_store(url) as store:
        assert store.list_campaigns() == []
    assert migrate.current(url) == migrate.head()


def test_unknown_revision_is_refused(url: str) -> None:
    with pytest.raises(InvalidField) as info:
        migrate.upgrade(url, "no-such-revision")
    assert info.value.field == "revision"


def test_unsupported_urls_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported"):
        open_store("mysql://localhost/db")
    with pytest.raises(ValueError, match="needs a file"):
        open_store("sqlite://")


def test_sqlite_connections_are_set_up_for_concurrency(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store, store.engine.connect() as c:
        pragmas = {
            name: c.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "foreign_keys", "busy_timeout", "synchronous")
        }
    # synchronous 1 is NORMAL.
    assert pragmas == {
        "journal_mode": "wal",
        "foreign_keys": 1,
        "busy_timeout": 30000,
        "synchronous": 1,
    }


_CLAIMER = """
import json, sys
from datetime import datetime, UTC
from sendqueue.adapters.sql import open_store
from sendqueue.domain.lifecycle import TaskOutcome, TaskState

url, ids = sys.argv[1], sys.argv[2].split(",")
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()
won = []
with open_store(url) as store:
    at = datetime.now(UTC)
    for tid in ids:
        if store.transition(tid, TaskState.PENDING, TaskState.RUNNING, at=at) is not None:
            won.append(tid)
print(json.dumps(won))
"""


def test_processes_claiming_the_same_tasks_never_both_win(url: str) -> None:
    count = 200
    ids = [task_id("c1", i) for i in range(count)]
    with open_store(url) as store:
        store.create_campaign(a_campaign(), [])
        store.insert_tasks(
            [bare_task("c1", i, T0 + timedelta(seconds=i)) for i in range(count)], at=T0
        )
        start = store.last_change_id()

    # The second process walks the tasks backwards, so the two meet in the middle.
    orders = [ids, list(reversed(ids))]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, url, ",".join(order)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for order in orders
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0]

    won = [set(json.loads(out)) for out in outputs]
    assert won[0].isdisjoint(won[1])
    assert won[0] | won[1] == set(ids)
    with open_store(url) as store:
        entries = store.changes_after(start, limit=10 * count)
        assert sorted(e.task_id or "" for e in entries) == sorted(ids)
        assert {e.to_state for e in entries} == {TaskState.RUNNING.value}
        assert store.count_tasks("c1")[TaskState.RUNNING] == count
