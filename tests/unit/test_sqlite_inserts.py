"""The SQLite store's insert of new tasks leaves their NULL columns out of the statement and
writes many rows per statement: the rows it writes are exactly those of the one-row statement
that binds every column, run row by row."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import exc as sa_exc

from sendqueue.adapters.sql import open_store
from sendqueue.adapters.sql.schema import sqlite_text
from sendqueue.adapters.sql.sqlite_inserts import _INTO_TASKS, _TASK_MARKS, insert_values, task_row
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task
from tests.contract.store_backends import campaign, make_task, recipients
from tests.support.app import T0

_SOME = st.none() | st.sampled_from(["", "x", "é ü", "<p>1</p>"])

#: A value for each column only a later write sets, and for ``planned_at``.
_LATER: dict[str, Any] = {
    "claimed_at": T0,
    "sent_at": T0 + timedelta(minutes=1),
    "message_id": "<m@example.com>",
    "error": "421 try later",
    "moved_reason": "worker down",
    "outcome": TaskOutcome.BOUNCED,
    "outcome_detail": "5.1.1 no such user",
    "outcome_at": T0 + timedelta(hours=1),
    "planned_at": T0 - timedelta(days=1),
}


@st.composite
def _task(draw: st.DrawFn, position: int, *, new: bool) -> Task:
    task = make_task(
        "c1",
        position,
        send_at=T0 + timedelta(seconds=draw(st.integers(0, 10**6))),
        # Mixed case: the address key (casefolded) differs from the address.
        email=draw(
            st.sampled_from([f"r{position}@example.com", f"R{position}.Straße@Example.COM"])
        ),
    )
    if draw(st.booleans()):
        task = replace(task, state=TaskState.CANCELLED, reason="suppressed: bounced")
    else:
        task = replace(task, reason=draw(st.none() | st.just("kept")))
    task = replace(
        task,
        html=draw(_SOME),
        sender_id=draw(st.none() | st.just("s1")),
        sender=draw(st.none() | st.just("a@example.com")),
        timezone=draw(st.none() | st.just("Europe/Paris")),
        step=draw(st.integers(1, 3)),
        attempts=draw(st.integers(0, 2)),
        moves=draw(st.integers(0, 2)),
    )
    if not new:  # one column a later write sets, or several
        later = draw(st.lists(st.sampled_from(sorted(_LATER)), min_size=1, unique=True))
        values = {column: _LATER[column] for column in later}
        task = replace(task, **values)
    return task


@st.composite
def _batch(draw: st.DrawFn) -> list[Task]:
    """A batch whose tasks are all new (the insert without NULL columns), or one with some
    tasks that are not (every column bound)."""
    size = draw(st.integers(1, 12))
    all_new = draw(st.booleans())
    return [
        draw(_task(position, new=all_new or draw(st.integers(0, 3)) > 0))
        for position in range(size)
    ]


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM tasks ORDER BY id").fetchall()


def _stored_both_ways(tmp_path: Path, batch: list[Task]) -> None:
    """The store's insert of ``batch`` writes the rows the statement of every column writes."""
    paths = []
    for name in ("store", "every-column"):
        path = tmp_path / f"{name}-{id(batch)}.db"
        path.unlink(missing_ok=True)
        store = open_store(f"sqlite:///{path}")
        store.create_campaign(campaign("c1"), recipients(len(batch)))
        if name == "store":
            assert store.insert_tasks(batch, at=T0) == len(batch)
        store.close()
        paths.append(path)
    with sqlite3.connect(paths[1]) as db:
        stamp = sqlite_text(T0)
        db.executemany(f"{_INTO_TASKS} VALUES {_TASK_MARKS}", [task_row(t, stamp) for t in batch])
    assert _rows(paths[0]) == _rows(paths[1])
    assert len(_rows(paths[0])) == len(batch)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=_batch())
def test_a_batch_is_stored_as_the_statement_of_every_column_stores_it(
    tmp_path: Path, batch: list[Task]
) -> None:
    _stored_both_ways(tmp_path, batch)


@pytest.mark.parametrize("column", sorted(_LATER))
def test_a_task_with_one_later_column_set_keeps_it(tmp_path: Path, column: str) -> None:
    value = _LATER[column]
    _stored_both_ways(
        tmp_path, [make_task("c1", 0), replace(make_task("c1", 1), **{column: value})]
    )


def test_a_resumed_batch_inserts_only_the_tasks_not_there(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    store.create_campaign(campaign("c1"), recipients(4))
    first = [make_task("c1", 0), make_task("c1", 1, html="<p>1</p>")]
    assert store.insert_tasks(first, at=T0) == 2
    again = [*first, make_task("c1", 2), make_task("c1", 3, timezone="Europe/Paris")]
    assert store.insert_tasks(again, at=T0) == 2
    stored = store.get_tasks([t.id for t in again])
    assert stored[again[1].id].html == "<p>1</p>"
    assert stored[again[3].id].timezone == "Europe/Paris"
    assert stored[again[2].id].planned_at == again[2].send_at
    store.close()


# -- many rows per statement ----------------------------------------------------------------------


def _pairs_table(limit: int) -> tuple[Any, sqlite3.Connection]:
    """A connection (SQLAlchemy's, over the driver's) to a new table of unique keys in memory,
    its driver allowing ``limit`` bound parameters per statement."""
    import sqlalchemy as sa

    engine = sa.create_engine("sqlite://")
    conn = engine.connect()
    conn.exec_driver_sql("CREATE TABLE pairs (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    driver.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
    return conn, driver


def _seed(conn: Any, keys: set[str]) -> None:
    for key in sorted(keys):
        conn.exec_driver_sql("INSERT INTO pairs VALUES (?, -1)", (key,))


@settings(max_examples=80, deadline=None)
@given(
    keys=st.lists(st.sampled_from("abcdefghij"), max_size=40),
    taken=st.sets(st.sampled_from("abcdefghij")),
    limit=st.integers(2, 25),
)
def test_many_rows_per_statement_take_what_one_row_at_a_time_takes(
    keys: list[str], taken: set[str], limit: int
) -> None:
    """Split into as many statements as the driver's limit needs, the rows taken and the count
    returned are executemany's: a key already stored, or earlier in the call, is skipped."""
    conn, driver = _pairs_table(limit)
    _seed(conn, taken)
    values = [(k, i) for i, k in enumerate(keys)]
    count = insert_values(conn, "INSERT INTO pairs (k, v)", "(?, ?)", values)
    stored = dict(driver.execute("SELECT k, v FROM pairs").fetchall())
    conn.rollback()
    conn.exec_driver_sql("DELETE FROM pairs")
    _seed(conn, taken)
    one_by_one = sum(
        conn.exec_driver_sql(
            "INSERT INTO pairs (k, v) VALUES (?, ?) ON CONFLICT DO NOTHING", row
        ).rowcount
        for row in values
    )
    assert count == one_by_one
    assert stored == dict(driver.execute("SELECT k, v FROM pairs").fetchall())
    conn.rollback()
    conn.close()


def test_rows_wider_than_the_limit_allows_go_one_per_statement() -> None:
    conn, driver = _pairs_table(1)
    with pytest.raises(sa_exc.OperationalError, match="too many SQL variables"):
        insert_values(conn, "INSERT INTO pairs (k, v)", "(?, ?)", [("a", 1)])
    driver.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 3)
    assert insert_values(conn, "INSERT INTO pairs (k, v)", "(?, ?)", [("a", 1), ("b", 2)]) == 2
    assert insert_values(conn, "INSERT INTO pairs (k, v)", "(?, ?)", []) == 0
    conn.close()


def test_batches_of_any_size_use_few_distinct_statements() -> None:
    """Full statements, then the rest in powers of two: the driver keeps a prepared statement
    per distinct text (up to 128 per connection, megabytes each for a thousand rows)."""
    import sqlalchemy as sa

    conn, _driver = _pairs_table(2 * 64)  # 64 rows of two per statement at most
    seen: set[str] = set()
    sa.event.listen(conn, "before_cursor_execute", lambda *args: seen.add(args[2]))
    for size in range(1, 300):
        values = [(f"{size}-{n}", n) for n in range(size)]
        assert insert_values(conn, "INSERT INTO pairs (k, v)", "(?, ?)", values) == size
    assert len(seen) == 7  # 64, 32, 16, 8, 4, 2 and 1 rows
    conn.close()
