"""The SQLite store's insert of new tasks leaves their NULL columns out of the statement: the
rows it writes are exactly those of the statement that binds every column."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.adapters.sql import open_store
from sendqueue.adapters.sql.schema import sqlite_text
from sendqueue.adapters.sql.sqlite_inserts import _INSERT_TASK, task_row
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task
from tests.contract.store_backends import campaign, make_task, recipients
from tests.support.app import T0

_SOME = st.none() | st.sampled_from(["", "x", "é ü", "<p>1</p>"])


@st.composite
def _task(draw: st.DrawFn, position: int) -> Task:
    task = make_task("c1", position, send_at=T0 + timedelta(seconds=draw(st.integers(0, 10**6))))
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
    if draw(st.integers(0, 9)) == 0:  # not new: a column set that only a later write sets
        task = replace(
            task,
            error=draw(st.none() | st.just("421 try later")),
            planned_at=draw(st.none() | st.just(T0)),
            outcome=draw(st.none() | st.just(TaskOutcome.BOUNCED)),
            outcome_at=draw(st.none() | st.just(T0 + timedelta(hours=1))),
            claimed_at=draw(st.none() | st.just(T0)),
        )
    return task


@st.composite
def _batch(draw: st.DrawFn) -> list[Task]:
    size = draw(st.integers(1, 12))
    return [draw(_task(position)) for position in range(size)]


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM tasks ORDER BY id").fetchall()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=_batch())
def test_a_batch_is_stored_as_the_statement_of_every_column_stores_it(
    tmp_path: Path, batch: list[Task]
) -> None:
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
        db.executemany(_INSERT_TASK, [task_row(t, stamp) for t in batch])
    assert _rows(paths[0]) == _rows(paths[1])
    assert len(_rows(paths[0])) == len(batch)


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
