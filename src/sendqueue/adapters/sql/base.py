"""What the SQLite and the PostgreSQL task store share: the engine, its transactions, and the
calls that are the same SQLAlchemy Core statement on both databases.

:class:`SqlTaskStore` implements :class:`sendqueue.ports.TaskStore`; the port's docstring is the
contract. A subclass per dialect (:class:`~sendqueue.adapters.sql.sqlite.SqliteTaskStore`,
:class:`~sendqueue.adapters.sql.postgres.PostgresTaskStore`) adds the calls whose statements
differ, and the send path's and the provisioner's statements, which run on the driver directly
(docs/performance.md, "SQL store: why the code looks this way"). How the contract is kept:

- Every write runs in one transaction. On SQLite that transaction starts with
  ``BEGIN IMMEDIATE`` (:data:`~sendqueue.adapters.sql.schema.WRITE`), so writers queue on the
  busy timeout instead of deadlocking on a lock upgrade; readers never block (WAL).
- A task state change is ``UPDATE ... WHERE id = :id AND state = :expected RETURNING ...``
  followed by the change-log INSERT in the same transaction. A row that did not match logs
  nothing.
- On PostgreSQL, change-log ids are ordered by writing transaction and readers return only
  settled entries; see :mod:`~sendqueue.adapters.sql.sidetables` (where the change-log reads,
  leases and counters live) and migration 0004.
- Vendor exceptions are wrapped here (:mod:`~sendqueue.adapters.sql.errors`): failures of the
  database become :class:`~sendqueue.domain.errors.StoreUnavailable`.

A store is safe to use from several threads and from several processes on one database. Open
it after forking: an engine's pooled connections must not cross a fork.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from sendqueue.adapters.campaign_reads import ComposedCampaignReads
from sendqueue.adapters.sql import migrate, rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.adapters.sql.errors import mapped_errors
from sendqueue.adapters.sql.feedback import FeedbackTables
from sendqueue.adapters.sql.schema import WRITE, UtcDateTime, create_store_engine
from sendqueue.adapters.sql.senders import SenderTables
from sendqueue.adapters.sql.sequences import SequenceTables
from sendqueue.adapters.sql.sidetables import SideTables
from sendqueue.adapters.sql.suppressions import SuppressionTables
from sendqueue.adapters.sql.taskcounts import TaskCounts
from sendqueue.adapters.sql.webhooks import WebhookTables
from sendqueue.domain.errors import Conflict, InvalidField, NotFound
from sendqueue.domain.lifecycle import (
    CampaignState,
    TaskOutcome,
    TaskState,
    check_campaign_transition,
    check_task_transition,
)
from sendqueue.domain.models import (
    Campaign,
    Move,
    Recipient,
    Task,
    TaskChanges,
    check_cursor,
    check_limit,
    check_new_tasks,
    check_step,
    checked_changes,
)
from sendqueue.domain.sendclaim import SendClaim, SendFinish
from sendqueue.domain.senders import Booking
from sendqueue.ports.changes import ChangeSignal

__all__ = ["SqlTaskStore"]


class SqlTaskStore(
    ComposedCampaignReads,
    SideTables,
    TaskCounts,
    SuppressionTables,
    FeedbackTables,
    SenderTables,
    WebhookTables,
    SequenceTables,
):
    """:class:`~sendqueue.ports.TaskStore` (and :class:`~sendqueue.ports.SuppressionList`,
    :class:`~sendqueue.ports.FeedbackStore`, :class:`~sendqueue.ports.SenderStore`) over a SQL
    database; one subclass per dialect.

    ``url`` is the subclass's dialect (``sqlite:///...`` or ``postgresql+psycopg://...``;
    ValueError for another). With ``upgrade`` (the default) the schema is migrated to the newest
    revision on open; pass ``upgrade=False`` where ``sendqueue db upgrade`` is run explicitly.
    ``engine_options`` go to :func:`sqlalchemy.create_engine` (e.g. ``pool_size``).
    """

    #: The SQLAlchemy dialect name this class serves.
    dialect: ClassVar[str]

    def __init__(
        self,
        url: str,
        *,
        upgrade: bool = True,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        # Creating the engine does not connect; an unreachable database shows on first use.
        self._engine: Engine = create_store_engine(url, **dict(engine_options or {}))
        if self._engine.dialect.name != self.dialect:
            self._engine.dispose()
            raise ValueError(f"{type(self).__name__} needs a {self.dialect} URL")
        self._writer = self._engine.execution_options(**WRITE)
        self._together = threading.local()
        if upgrade:
            try:
                migrate.upgrade_engine(self._engine)
            except BaseException:
                self._engine.dispose()
                raise

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for migrations and diagnostics."""
        return self._engine

    def __enter__(self) -> SqlTaskStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close what is open (like the engine's ``dispose()``); a later call opens anew."""
        self._engine.dispose()

    # transactions ----------------------------------------------------------------------------

    @contextmanager
    def _write(self, action: str) -> Iterator[Connection]:
        with mapped_errors(action), self._writer.begin() as conn:
            yield conn

    @contextmanager
    def _read(self, action: str) -> Iterator[Connection]:
        shared: Connection | None = getattr(self._together, "conn", None)
        if shared is not None:  # inside _read_together: one connection for the whole read
            yield shared
            return
        with mapped_errors(action), self._engine.connect() as conn:
            yield conn

    @contextmanager
    def _read_together(self) -> Iterator[Connection]:
        """The reads of one :class:`~sendqueue.ports.reads.CampaignReads` call share a
        connection (and its transaction: one snapshot on SQLite)."""
        with mapped_errors("read a view"), self._engine.connect() as conn:
            self._together.conn = conn
            try:
                yield conn
            finally:
                self._together.conn = None

    @property
    @abstractmethod
    def change_signal(self) -> ChangeSignal:
        """Wakes readers of the change log on commit (:mod:`sendqueue.adapters.sql.signal`)."""

    @abstractmethod
    def _log(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append change-log rows (:func:`~sendqueue.adapters.sql.rows.log_row`) inside the
        caller's transaction."""

    def _require_campaign(self, conn: Connection, campaign_id: str) -> None:
        found = conn.execute(
            sa.select(tables.campaigns.c.id).where(tables.campaigns.c.id == campaign_id)
        ).first()
        if found is None:
            raise NotFound("campaign", campaign_id)

    def _current_campaign_state(self, conn: Connection, campaign_id: str) -> str | None:
        """The campaign's state inside a write, before :meth:`set_campaign_state` changes it."""
        query = sa.select(tables.campaigns.c.state).where(tables.campaigns.c.id == campaign_id)
        return conn.execute(query).scalar_one_or_none()

    # campaigns -------------------------------------------------------------------------------

    def create_campaign(self, campaign: Campaign, recipients: Iterable[Recipient]) -> None:
        """Store the campaign and its recipients in one transaction, or nothing.

        ``recipients`` is consumed once, a chunk at a time, inside the transaction, and
        ``recipient_count`` is stored as the number consumed. An existing id raises Conflict;
        two recipients with one position raise InvalidField (``position``), found by the
        primary key rather than by a set of every position held here.
        """
        rows.json_ready("checkpoint", campaign.checkpoint)
        campaign_row = rows.campaign_row(campaign, 0)
        count = 0
        with self._write("create campaign") as conn:
            try:
                conn.execute(sa.insert(tables.campaigns), campaign_row)
            except sa_exc.IntegrityError as exc:
                raise Conflict(f"campaign {campaign.id!r} already exists") from exc
            for chunk in rows.batches(recipients):
                positions = [r.position for r in chunk]
                if len(set(positions)) < len(positions):
                    raise InvalidField(
                        "position", _repeated(positions), "each recipient needs its own position"
                    )
                try:
                    conn.execute(
                        sa.insert(tables.recipients), rows.recipient_rows(campaign.id, chunk)
                    )
                except sa_exc.IntegrityError as exc:
                    # The only key a recipient can clash on is (campaign, position).
                    raise InvalidField(
                        "position",
                        f"one of {min(positions)}..{max(positions)}",
                        f"each recipient needs its own position ({exc.orig})",
                    ) from exc
                count += len(chunk)
            conn.execute(
                sa.update(tables.campaigns)
                .where(tables.campaigns.c.id == campaign.id)
                .values(recipient_count=count)
            )

    @abstractmethod
    def campaign_state(self, campaign_id: str) -> CampaignState:
        """Only the campaign's current state (NotFound for an unknown campaign).

        The send worker checks the state around every claim; this reads one column instead of
        building the whole campaign (its policy is JSON).
        """

    def get_campaign(self, campaign_id: str) -> Campaign:
        with self._read("get campaign") as conn:
            row = conn.execute(
                sa.select(tables.campaigns).where(tables.campaigns.c.id == campaign_id)
            ).first()
        if row is None:
            raise NotFound("campaign", campaign_id)
        return rows.campaign_from_row(row)

    def list_campaigns(self) -> list[Campaign]:
        with self._read("list campaigns") as conn:
            found = conn.execute(
                sa.select(tables.campaigns).order_by(
                    tables.campaigns.c.created_at.desc(), tables.campaigns.c.id.desc()
                )
            ).all()
        return [rows.campaign_from_row(row) for row in found]

    def set_campaign_state(
        self,
        campaign_id: str,
        expected: Collection[CampaignState],
        new: CampaignState,
        *,
        at: datetime,
        reason: str | None = None,
    ) -> bool:
        """CAS on the campaign state; every ``expected -> new`` must be a legal transition."""
        for state in expected:
            check_campaign_transition(state, new)
        with self._write("set campaign state") as conn:
            current = self._current_campaign_state(conn, campaign_id)
            if current is None:
                raise NotFound("campaign", campaign_id)
            if CampaignState(current) not in expected:
                return False
            conn.execute(
                sa.update(tables.campaigns)
                .where(tables.campaigns.c.id == campaign_id)
                .values(state=new.value, state_reason=reason, updated_at=at)
            )
            self._log(conn, [rows.log_row(campaign_id, None, current, new.value, at, reason)])
            return True

    @abstractmethod
    def save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        *,
        at: datetime,
        note: str | None = None,
    ) -> None: ...

    # recipients ------------------------------------------------------------------------------

    @abstractmethod
    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]: ...

    # tasks -----------------------------------------------------------------------------------

    def insert_tasks(
        self, tasks: Sequence[Task], *, at: datetime, bookings: Sequence[Booking] = ()
    ) -> int:
        """Insert the tasks whose id (and campaign position) is free; log each ``None -> Pending``
        (``None -> Cancelled`` with its reason as the note, for a suppressed recipient's); book
        ``bookings`` in the same transaction (all or nothing: Overbooked inserts nothing).

        Every task must be Pending, or Cancelled with a reason (IllegalTransition otherwise) and
        belong to an existing campaign (NotFound otherwise). ``created_at`` and ``updated_at``
        are set to ``at``.
        """
        if not tasks:
            self.book(bookings)
            return 0
        check_new_tasks(tasks)
        return self._insert_tasks(tasks, at, bookings)

    @abstractmethod
    def _insert_tasks(
        self, tasks: Sequence[Task], at: datetime, bookings: Sequence[Booking]
    ) -> int:
        """:meth:`insert_tasks` of checked, non-empty ``tasks``; returns the count inserted."""

    @abstractmethod
    def get_task(self, task_id: str) -> Task | None: ...

    @abstractmethod
    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]: ...

    def transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        changes: TaskChanges | None = None,
        note: str | None = None,
    ) -> Task | None:
        check_task_transition(expected, new)
        values = checked_changes(changes)
        if values.get("outcome") is not None:
            values["outcome"] = TaskOutcome(values["outcome"]).value
        values.update(state=new.value, updated_at=at)
        return self._transition(task_id, expected, new, values, at, note)

    @abstractmethod
    def _transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        values: Mapping[str, Any],
        at: datetime,
        note: str | None,
    ) -> Task | None:
        """:meth:`transition` once checked: ``values`` are the columns to set."""

    @abstractmethod
    def claim_for_send(
        self,
        task_id: str,
        *,
        token: str | None,
        at: datetime,
        due_by: datetime,
        not_before: datetime | None = None,
    ) -> SendClaim:
        """One round trip per dialect: :mod:`sendqueue.adapters.sql.sending`."""

    @abstractmethod
    def finish_send(
        self,
        task_id: str,
        *,
        at: datetime,
        message_id: str,
        slot: datetime | None = None,
        follow_up: bool = False,
    ) -> SendFinish:
        """One round trip per dialect: :mod:`sendqueue.adapters.sql.sending`."""

    def transition_all(
        self,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        note: str | None = None,
    ) -> int:
        """Move every task of the campaign in ``expected`` to ``new``; one log entry each.

        The entries are written in position order. NotFound for an unknown campaign.
        """
        check_task_transition(expected, new)
        with self._write("transition tasks") as conn:
            self._require_campaign(conn, campaign_id)
            return self._transition_all(conn, campaign_id, expected, new, at, note)

    @abstractmethod
    def _transition_all(
        self,
        conn: Connection,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        at: datetime,
        note: str | None,
    ) -> int:
        """:meth:`transition_all` inside its transaction, the campaign known to exist."""

    def reschedule(self, moves: Sequence[Move], *, at: datetime, reason: str) -> int:
        """Each move a compare-and-set on (Pending, token); the moved rows, found again by their
        new tokens (fresh random ones), get their ``Pending -> Pending`` entries in position
        order, in the same transaction."""
        if not moves:
            return 0
        statement = (
            sa.update(tables.tasks)
            .where(
                tables.tasks.c.id == sa.bindparam("b_id"),
                tables.tasks.c.state == TaskState.PENDING.value,
                tables.tasks.c.token == sa.bindparam("b_token"),
            )
            .values(
                send_at=sa.bindparam("b_send_at", type_=UtcDateTime()),
                token=sa.bindparam("b_new_token"),
                moves=tables.tasks.c.moves + 1,
                moved_reason=sa.bindparam("b_reason", type_=sa.Text()),
                updated_at=sa.bindparam("b_at", type_=UtcDateTime()),
            )
        )
        params = [
            {
                "b_id": m.task_id,
                "b_token": m.token,
                "b_send_at": m.send_at,
                "b_new_token": m.new_token,
                "b_reason": reason,
                "b_at": at,
            }
            # In id order, so two concurrent reschedules take their row locks in one order.
            for m in sorted(moves, key=lambda m: m.task_id)
        ]
        note = f"moved: {reason}"
        updated = 0
        with self._write("reschedule tasks") as conn:
            for chunk in rows.chunks(params):
                if not conn.execute(statement, list(chunk)).rowcount:
                    continue
                found = conn.execute(
                    sa.select(tables.tasks.c.campaign_id, tables.tasks.c.id)
                    .where(
                        tables.tasks.c.id.in_([p["b_id"] for p in chunk]),
                        tables.tasks.c.token.in_([p["b_new_token"] for p in chunk]),
                    )
                    .order_by(tables.tasks.c.campaign_id, tables.tasks.c.position)
                ).all()
                pending = TaskState.PENDING.value
                self._log(conn, [rows.log_row(c, t, pending, pending, at, note) for c, t in found])
                updated += len(found)
        return updated

    def list_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> list[Task]:
        """A page in position order; ``search`` is a case-insensitive substring of the address
        (``%`` and ``_`` match themselves). NotFound for an unknown campaign."""
        check_limit(limit)
        check_cursor(after)
        if step is not None:
            check_step(step)
        with self._read("list tasks") as conn:
            self._require_campaign(conn, campaign_id)
            return self._page_of_tasks(conn, campaign_id, state, search, after, limit, step)

    def _page_of_tasks(
        self,
        conn: Connection,
        campaign_id: str,
        state: TaskState | None,
        search: str | None,
        after: int,
        limit: int,
        step: int | None,
    ) -> list[Task]:
        """:meth:`list_tasks` once checked, the campaign known to exist."""
        query = sa.select(tables.tasks).where(
            tables.tasks.c.campaign_id == campaign_id, tables.tasks.c.position > after
        )
        if state is not None:
            query = query.where(tables.tasks.c.state == state.value)
        if step is not None:
            query = query.where(tables.tasks.c.step == step)
        if search and "\x00" in search:
            # No address holds a NUL (the importer refuses control characters), and PostgreSQL
            # refuses one in any text parameter: nothing matches, on either database.
            query = query.where(sa.false())
        elif search:
            query = query.where(tables.tasks.c.email.icontains(search, autoescape=True))
        query = query.order_by(tables.tasks.c.position).limit(limit)
        return [rows.task_from_row(row) for row in conn.execute(query).all()]

    @abstractmethod
    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        """Whether any task of the campaign is Pending or Running, or marked as having its next
        step to make (False for an unknown one).

        The send worker asks this after every send, and only when the answer is no does it run
        the campaign service's completion check (which asks again before its state change).
        """

    def due_tasks(
        self,
        state: TaskState,
        *,
        before: datetime,
        after: tuple[datetime, str] | None = None,
        limit: int = 1000,
    ) -> list[Task]:
        check_limit(limit)
        query = sa.select(tables.tasks).where(
            tables.tasks.c.state == state.value, tables.tasks.c.send_at < before
        )
        if after is not None:
            send_at, task_id = after
            query = query.where(
                sa.or_(
                    tables.tasks.c.send_at > send_at,
                    sa.and_(tables.tasks.c.send_at == send_at, tables.tasks.c.id > task_id),
                )
            )
        query = query.order_by(tables.tasks.c.send_at, tables.tasks.c.id).limit(limit)
        with self._read("list due tasks") as conn:
            found = conn.execute(query).all()
        return [rows.task_from_row(row) for row in found]

    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]:
        """Tasks per state, every state present. NotFound for an unknown campaign."""
        query = (
            sa.select(tables.tasks.c.state, sa.func.count())
            .where(tables.tasks.c.campaign_id == campaign_id)
            .group_by(tables.tasks.c.state)
        )
        with self._read("count tasks") as conn:
            self._require_campaign(conn, campaign_id)
            found = conn.execute(query).all()
        counts = dict.fromkeys(TaskState, 0)
        for state, count in found:
            counts[TaskState(state)] = count
        return counts


def _repeated(positions: list[int]) -> int:
    """The first position of ``positions`` that repeats an earlier one."""
    seen: set[int] = set()
    for position in positions:
        if position in seen:
            return position
        seen.add(position)
    raise ValueError("no position repeats")
