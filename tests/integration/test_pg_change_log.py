"""The PostgreSQL change log without a global lock (migration 0004): ids ordered by writing
transaction, readers handed only entries no transaction can still commit behind.

Deterministic: transactions are held open on purpose instead of timed; the many-writers test
asserts on what the tailing readers saw, never on how fast.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
import sqlalchemy as sa

from sendqueue.adapters.sql import PostgresTaskStore, migrate
from sendqueue.adapters.sql.schema import create_store_engine
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, Move, Recipient, Task, task_id
from sendqueue.domain.policy import SendingPolicy
from sendqueue.ports import TaskStore
from sendqueue.testing.tasks import bare_task
from sendqueue.web.stream import ChangeBroker
from tests.conftest import POSTGRES_ADMIN_URL
from tests.support.app import T0
from tests.web.test_stream_status import FAST, Reader, _gen

pytestmark = pytest.mark.postgres

S = TaskState


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresTaskStore]:
    opened = PostgresTaskStore(postgres_url)
    yield opened
    opened.close()


def _psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _campaign(store: PostgresTaskStore, cid: str, count: int) -> list[Task]:
    store.create_campaign(
        Campaign(
            id=cid, name=cid, policy=SendingPolicy(), from_addr="a@example.com", created_at=T0
        ),
        [Recipient(position=i, email=f"r{i}@example.com") for i in range(count)],
    )
    tasks = [_task(cid, i) for i in range(count)]
    assert store.insert_tasks(tasks, at=T0) == count
    return tasks


def _task(cid: str, position: int) -> Task:
    return bare_task(cid, position, T0 + timedelta(minutes=position))


def _everything(
    store: TaskStore, after: int = 0, campaign_id: str | None = None
) -> list[ChangeLogEntry]:
    out: list[ChangeLogEntry] = []
    while page := store.changes_after(after, campaign_id=campaign_id, limit=500):
        out.extend(page)
        after = page[-1].id
    return out


def test_an_entry_committed_behind_an_open_transaction_waits_for_it(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    # The counter-example to paging by a plain sequence: A (older) logs, B (newer) logs and
    # commits first. Returning B then would let A commit behind the reader's cursor.
    _campaign(store, "c1", 2)
    cursor = store.last_change_id()
    with psycopg.connect(_psycopg_url(postgres_url)) as a:
        a.execute("SELECT pg_current_xact_id()")  # A holds an xid from here on
        assert store.transition(task_id("c1", 0), S.PENDING, S.RUNNING, at=T0)  # B commits
        assert store.changes_after(cursor) == []
        assert store.last_change_id() == cursor
        # committed but held back: the live stream's head check sees it is behind
        assert store.newest_change_id() > cursor
        a.execute(
            "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at)"
            " VALUES ('c1', %s, 'Pending', 'Cancelled', now())",
            (task_id("c1", 1),),
        )
        assert store.changes_after(cursor) == []
        a.commit()
    after = store.changes_after(cursor)
    # A's entry first: the order is by writing transaction, and the reader missed nothing.
    assert [(e.task_id, e.to_state) for e in after] == [
        (task_id("c1", 1), "Cancelled"),
        (task_id("c1", 0), "Running"),
    ]
    assert store.last_change_id() == after[-1].id


def test_a_transaction_in_another_database_does_not_hold_the_log_back(
    store: PostgresTaskStore,
) -> None:
    _campaign(store, "c1", 1)
    cursor = store.last_change_id()
    with psycopg.connect(POSTGRES_ADMIN_URL) as other:  # another database of the cluster
        other.execute("SELECT pg_current_xact_id()")
        assert store.transition(task_id("c1", 0), S.PENDING, S.RUNNING, at=T0)
        [entry] = store.changes_after(cursor)
        assert entry.to_state == "Running"
        assert store.last_change_id() == entry.id


def test_many_writers_and_tailing_readers_see_every_entry_once(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    """Every path that logs, from many threads at once, against a reader of the whole log and
    a reader of one campaign: each sees every entry exactly once, in id order."""
    writers, per_writer = 12, 30
    for w in range(writers):
        _campaign(store, f"w{w}", per_writer)
    store.create_campaign(
        Campaign(id="bulk", name="b", policy=SendingPolicy(), from_addr="a@x.org", created_at=T0),
        [],
    )
    start = store.last_change_id()
    handles = [PostgresTaskStore(postgres_url) for _ in range(writers + 2)]
    errors: list[BaseException] = []
    done = threading.Event()
    seen_all: list[int] = []
    seen_w0: list[int] = []

    def write(w: int) -> None:
        s, cid = handles[w], f"w{w}"
        try:
            half = per_writer // 2
            for i in range(half):
                tid = task_id(cid, i)
                assert s.transition(tid, S.PENDING, S.RUNNING, at=T0)
                assert s.transition(tid, S.RUNNING, S.FINISHED, at=T0)
            moves = [
                Move(task_id(cid, i), f"tok{i}", T0 + timedelta(hours=1), f"new{i}")
                for i in range(half, per_writer)
            ]
            assert s.reschedule(moves, at=T0, reason="spread") == per_writer - half
            s.save_checkpoint(cid, {"w": w}, at=T0, note="halfway")
            assert s.transition_all(cid, S.PENDING, S.CANCELLED, at=T0) == per_writer - half
            draft, prov = CampaignState.DRAFT, CampaignState.PROVISIONING
            assert s.set_campaign_state(cid, {draft}, prov, at=T0)
            bulk = [_task("bulk", w * per_writer + i) for i in range(per_writer)]
            assert s.insert_tasks(bulk, at=T0) == per_writer
        except BaseException as exc:
            errors.append(exc)

    def tail(s: PostgresTaskStore, seen: list[int], campaign_id: str | None) -> None:
        after = start
        try:
            while True:
                finished = done.is_set()
                page = s.changes_after(after, campaign_id=campaign_id, limit=37)
                seen.extend(e.id for e in page)
                if page:
                    after = page[-1].id
                elif finished:
                    return
        except BaseException as exc:
            errors.append(exc)

    readers = [
        threading.Thread(target=tail, args=(handles[writers], seen_all, None)),
        threading.Thread(target=tail, args=(handles[writers + 1], seen_w0, "w0")),
    ]
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    try:
        for t in [*readers, *threads]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        for t in readers:
            t.join()
    finally:
        for h in handles:
            h.close()

    assert errors == []
    logged = _everything(store, start)
    # per writer: 2 per finished task, 1 per move, a checkpoint, 1 per cancel, a campaign
    # change, and 1 per bulk-inserted task
    half = per_writer // 2
    assert len(logged) == writers * (2 * half + 2 * (per_writer - half) + 2 + per_writer)
    assert seen_all == [e.id for e in logged]
    assert seen_w0 == [e.id for e in logged if e.campaign_id == "w0"]
    assert store.last_change_id() == logged[-1].id


def test_a_client_resuming_after_a_pre_0004_id_neither_misses_nor_replays(
    postgres_url: str,
) -> None:
    migrate.upgrade(postgres_url, "0003")
    engine = create_store_engine(postgres_url)
    # Old ids: sequence ones, then one far above anything xid << 22 gives on this server, as a
    # database that logged big bulk inserts could hold.
    old_top = 1 << 50
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO campaigns (id, name, policy, from_addr, state,"
                    " recipient_count, created_at, updated_at) VALUES ('c1', 'C', '{}',"
                    " 'a@example.com', 'draft', 0, :at, :at)"
                ),
                {"at": T0},
            )
            for note in ("one", "two", "three"):
                conn.execute(
                    sa.text(
                        "INSERT INTO change_log (campaign_id, to_state, at, note)"
                        " VALUES ('c1', 'progress', :at, :note)"
                    ),
                    {"at": T0, "note": note},
                )
            conn.execute(
                sa.text(
                    "INSERT INTO change_log (id, campaign_id, to_state, at, note)"
                    " VALUES (:id, 'c1', 'progress', :at, 'top')"
                ),
                {"id": old_top, "at": T0},
            )
    finally:
        engine.dispose()

    with PostgresTaskStore(postgres_url) as store:  # upgrades to head on open
        old = _everything(store)
        assert [(e.id, e.note) for e in old] == [
            (1, "one"),
            (2, "two"),
            (3, "three"),
            (old_top, "top"),
        ]
        assert store.last_change_id() == old_top
        store.save_checkpoint("c1", {"n": 1}, at=T0, note="new one")
        store.save_checkpoint("c1", {"n": 2}, at=T0, note="new two")

        # A client that had seen up to "two" gets the rest, old then new, once each.
        resumed = _everything(store, after=2)
        assert [e.note for e in resumed] == ["three", "top", "new one", "new two"]
        assert [e.note for e in _everything(store, after=old_top)] == ["new one", "new two"]
        assert resumed[-2].id > old_top
        assert store.last_change_id() == resumed[-1].id


def test_ids_copied_in_are_followed_after_a_rebase(store: PostgresTaskStore) -> None:
    # What `sendqueue db migrate-to` does after copying a SQLite log, ids included.
    _campaign(store, "c1", 1)
    copied = (1 << 52) + 5
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO change_log (id, campaign_id, to_state, at)"
                " VALUES (:id, 'c1', 'progress', now())"
            ),
            {"id": copied},
        )
        conn.execute(sa.text("SELECT sq_change_log_rebase()"))
    assert store.transition(task_id("c1", 0), S.PENDING, S.RUNNING, at=T0)
    [entry] = store.changes_after(copied)
    assert entry.id > copied


def test_ids_past_the_encodable_range_are_refused_not_wrapped(store: PostgresTaskStore) -> None:
    _campaign(store, "c1", 1)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO change_log (id, campaign_id, to_state, at)"
                " VALUES (9223372036854775807, 'c1', 'progress', now())"
            )
        )
        conn.execute(sa.text("SELECT sq_change_log_rebase()"))
    with pytest.raises(StoreUnavailable, match="change-log ids are exhausted"):
        store.transition(task_id("c1", 0), S.PENDING, S.RUNNING, at=T0)
    assert store.get_task(task_id("c1", 0)).state is S.PENDING  # type: ignore[union-attr]


def test_the_live_stream_is_delayed_not_gapped_while_a_transaction_holds_the_log_back(
    store: PostgresTaskStore, postgres_url: str
) -> None:
    _campaign(store, "c1", 2)
    broker = ChangeBroker(store, FAST)

    async def scenario() -> None:
        sub = await broker.subscribe("c1", None)
        client = Reader(_gen(broker.frames(sub)))
        await client.until("live")
        with psycopg.connect(_psycopg_url(postgres_url)) as a:
            a.execute("SELECT pg_current_xact_id()")
            moved = await asyncio.to_thread(
                store.transition, task_id("c1", 0), S.PENDING, S.RUNNING, at=T0
            )
            assert moved is not None
            delayed = await client.until("delayed")
            assert delayed["cause"] == "behind"
            assert client.changes == []
            a.execute(
                "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at)"
                " VALUES ('c1', %s, 'Pending', 'Cancelled', now())",
                (task_id("c1", 1),),
            )
            a.commit()
        await client.until("live")
        async with asyncio.timeout(5):
            while len(client.changes) < 2:
                await client.for_seconds(0.05)
        logged = [e.id for e in _everything(store)][-2:]
        assert client.changes == logged  # A's entry, then B's: none missed, none twice
        await broker.close()

    asyncio.run(scenario())
