"""The task store's SQL schema, and the engine set-up both SQL dialects rely on.

The tables here are the *current* schema. The Alembic migrations in ``migrations/`` beside
this module create it; ``tests/integration/test_migrations.py`` checks that upgrading to head
yields exactly this metadata, so a change here needs a new migration.

:func:`create_store_engine` builds an engine for ``sqlite:///FILE`` or
``postgresql+psycopg://...``. On SQLite it turns on WAL, foreign keys, a 30 s busy timeout and
``synchronous=NORMAL`` for every connection, and lets writers open their transaction with
``BEGIN IMMEDIATE`` (see :data:`WRITE`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine

from sendqueue.domain.models import utc

__all__ = [
    "BUSY_TIMEOUT_SECONDS",
    "WRITE",
    "UtcDateTime",
    "campaigns",
    "change_log",
    "counters",
    "create_store_engine",
    "dead_letter_relays",
    "feedback_cursors",
    "leases",
    "metadata",
    "normalise_url",
    "recipients",
    "sender_bookings",
    "sender_contacts",
    "sender_days",
    "senders",
    "soft_bounces",
    "sqlite_text",
    "suppressions",
    "tasks",
    "webhook_deliveries",
    "webhook_endpoints",
]

BUSY_TIMEOUT_SECONDS = 30.0
#: WAL pages before a commit folds the log back into the database file (SQLite's default is
#: 1,000, about 4 MB): a provisioning run writes tens of MB, and each fold costs two fsyncs,
#: about a tenth of its time at 1,000 (docs/performance.md). The log is cut back to
#: WAL_KEEP_BYTES once folded, so it never stays at its peak on disk.
WAL_AUTOCHECKPOINT_PAGES = 10_000
WAL_KEEP_BYTES = 4 * 1024 * 1024

#: Execution option that makes a SQLite transaction start with ``BEGIN IMMEDIATE``. Use it for
#: every transaction that writes: a deferred transaction that reads first and writes later has to
#: upgrade its lock, and two processes doing that at once deadlock (SQLITE_BUSY without waiting).
#: Taking the write lock up front makes the second writer wait on the busy timeout instead.
WRITE = {"sqlite_begin": "IMMEDIATE"}


class UtcDateTime(sa.TypeDecorator[datetime]):
    """An aware datetime, stored as UTC and always read back as aware UTC.

    PostgreSQL keeps ``timestamptz``. SQLite has no time zones, so the value is stored as naive
    UTC text (fixed width, so text order is time order) and UTC is re-attached on read. Naive
    input is refused: it would be ambiguous.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = utc(value)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def bind_processor(self, dialect: Dialect) -> Callable[[datetime | None], Any] | None:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        # One C call instead of SQLAlchemy's two Python layers: bulk inserts bind many of these.
        return sqlite_text

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def sqlite_text(value: datetime | None) -> str | None:
    """How :class:`UtcDateTime` stores an aware datetime on SQLite: naive UTC text, exactly
    SQLAlchemy's SQLite DATETIME format (which reads it back). ValueError for a naive one."""
    if value is None:
        return None
    if value.tzinfo is UTC:
        # isoformat of a UTC value ends in "+00:00"; slicing it off is cheaper than replace().
        return value.isoformat(" ", "microseconds")[:-6]
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r} where an aware one is required")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _json() -> sa.JSON:
    # none_as_null: a Python None is SQL NULL, not the JSON literal 'null'.
    return sa.JSON(none_as_null=True)


metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

campaigns = sa.Table(
    "campaigns",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("policy", _json(), nullable=False),
    sa.Column("from_addr", sa.Text, nullable=False),
    sa.Column("reply_to", sa.Text, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("state_reason", sa.Text, nullable=True),
    sa.Column("recipient_count", sa.Integer, nullable=False),
    sa.Column("checkpoint", _json(), nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    # Which Pending emails a reply cancels, and the unsubscribe footer (migration 0006).
    sa.Column("stop_on_reply", sa.String(16), nullable=False, server_default="sender"),
    sa.Column("unsubscribe_footer", sa.Boolean, nullable=False, server_default=sa.false()),
    # The senders its recipients are spread across, a JSON array (NULL: none, the campaign's
    # from_addr), and whether windows follow each recipient's zone (migration 0007).
    sa.Column("sender_ids", _json(), nullable=True),
    sa.Column("local_time", sa.Boolean, nullable=False, server_default=sa.false()),
    # Its sequence's steps as templates, a JSON array, step 1 first (NULL: a campaign stored
    # before steps were, migration 0012).
    sa.Column("steps", _json(), nullable=True),
    sa.Index("ix_campaigns_created_at", "created_at"),
)

recipients = sa.Table(
    "recipients",
    metadata,
    sa.Column(
        "campaign_id",
        sa.String(64),
        sa.ForeignKey("campaigns.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("email", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("html", sa.Text, nullable=True),
    sa.Column("variables", _json(), nullable=False),
    # The recipient's own IANA zone, NULL: the campaign's (migration 0007).
    sa.Column("timezone", sa.Text, nullable=True),
)

tasks = sa.Table(
    "tasks",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column(
        "campaign_id",
        sa.String(64),
        sa.ForeignKey("campaigns.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("email", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("html", sa.Text, nullable=True),
    sa.Column("send_at", UtcDateTime, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("token", sa.String(64), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("claimed_at", UtcDateTime, nullable=True),
    sa.Column("sent_at", UtcDateTime, nullable=True),
    sa.Column("message_id", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    # The first planned send instant, how often the task was moved and why (migration 0003).
    sa.Column("planned_at", UtcDateTime, nullable=True),
    sa.Column("moves", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("moved_reason", sa.Text, nullable=True),
    # Why it was cancelled, e.g. "suppressed: bounced" (migration 0005).
    sa.Column("reason", sa.Text, nullable=True),
    # What happened after sending (migration 0006): accepted, bounced, ... with detail and time.
    sa.Column("outcome", sa.String(16), nullable=True),
    sa.Column("outcome_detail", sa.Text, nullable=True),
    sa.Column("outcome_at", UtcDateTime, nullable=True),
    # The sender it goes out from, that sender's address as planned and the recipient's zone
    # in a local-time campaign; NULL: the campaign's (migration 0007). Declared before
    # email_key (the database has them after it) so that ``select(tasks)`` rows start with
    # rows.TASK_COLUMNS.
    sa.Column("sender_id", sa.String(200), nullable=True),
    sa.Column("sender", sa.Text, nullable=True),
    sa.Column("timezone", sa.Text, nullable=True),
    # Which step of the campaign's sequence, 1-based (migration 0011: existing rows are 1).
    sa.Column("step", sa.Integer, nullable=False, server_default=sa.text("1")),
    # The address's compared form, key_of_normalized(email) (casefold, which SQL's lower() is
    # not), written at insert: FeedbackStore.tasks_for reads it through its index. Nullable
    # so that 0006 adds it in place (no table copy) before filling every row.
    sa.Column("email_key", sa.String(320), nullable=True),
    # A sent step whose sequence's next step is still to be made (migration 0014): set by the
    # finish, cleared once the step is made. Partial index: few rows are ever marked.
    sa.Column("follow_up", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index(
        "ix_tasks_follow_up",
        "campaign_id",
        "position",
        "step",
        sqlite_where=sa.text("follow_up = 1"),
        postgresql_where=sa.text("follow_up"),
    ),
    # list_tasks / count_tasks: one campaign's tasks in a state, in position order.
    sa.Index("ix_tasks_campaign_id_state_position", "campaign_id", "state", "position"),
    # list_tasks without a state filter, and one task per recipient and step (migration 0011).
    sa.Index("ix_tasks_campaign_id_position_step", "campaign_id", "position", "step", unique=True),
    # due_tasks: ordered by (send_at, id) within a state, so the cursor is index-only.
    sa.Index("ix_tasks_state_send_at_id", "state", "send_at", "id"),
    # stale_running: Running tasks by claim time.
    sa.Index("ix_tasks_state_claimed_at", "state", "claimed_at"),
    # tasks_for: an address's tasks in some states, across campaigns.
    sa.Index("ix_tasks_email_key_state", "email_key", "state"),
)

change_log = sa.Table(
    "change_log",
    metadata,
    # SQLite only auto-increments an INTEGER PRIMARY KEY; AUTOINCREMENT keeps ids from ever being
    # reused. PostgreSQL gets a BIGSERIAL.
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column(
        "campaign_id",
        sa.String(64),
        sa.ForeignKey("campaigns.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("task_id", sa.String(200), nullable=True),
    sa.Column("from_state", sa.String(16), nullable=True),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("at", UtcDateTime, nullable=False),
    sa.Column("note", sa.Text, nullable=True),
    sa.Index("ix_change_log_campaign_id_id", "campaign_id", "id"),
    sqlite_autoincrement=True,
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("expires_at", UtcDateTime, nullable=False),
)

#: Named counters (TaskStore.counter): one row each, e.g. the web's session generation.
counters = sa.Table(
    "counters",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)


#: The suppression list (migration 0005): one row per address in its compared form
#: (case-folded), paged in address order by the primary key.
suppressions = sa.Table(
    "suppressions",
    metadata,
    sa.Column("email", sa.String(320), primary_key=True),
    sa.Column("reason", sa.String(16), nullable=False),
    sa.Column("task_id", sa.String(200), nullable=True),
    sa.Column("at", UtcDateTime, nullable=False),
)

#: Transient bounces (migration 0006): one row per (address, the message it came from), so the
#: same DSN read twice counts once; counted per address since a time.
soft_bounces = sa.Table(
    "soft_bounces",
    metadata,
    sa.Column("email", sa.String(320), primary_key=True),
    sa.Column("key", sa.String(1000), primary_key=True),
    sa.Column("at", UtcDateTime, nullable=False),
)

#: The return date an out-of-office notice of a campaign's recipient named (migration 0013):
#: one row per (campaign, position), the newest notice's; the follow-up maker reads it.
away_dates = sa.Table(
    "away_dates",
    metadata,
    sa.Column("campaign_id", sa.String(64), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("until", sa.Date, nullable=False),
    sa.Column("at", UtcDateTime, nullable=False),
)

#: Each feedback mailbox's position (migration 0006): its UIDVALIDITY and the highest UID
#: processed, so a message is processed once across restarts and pollers.
feedback_cursors = sa.Table(
    "feedback_cursors",
    metadata,
    sa.Column("mailbox", sa.String(1000), primary_key=True),
    sa.Column("uidvalidity", sa.BigInteger, nullable=False),
    sa.Column("uid", sa.BigInteger, nullable=False),
    # What the last pass over the mailbox saw (migration 0008): when it ended, how many
    # messages it read, and its error (credentials masked; NULL: it went through).
    sa.Column("polled_at", UtcDateTime, nullable=True),
    sa.Column("messages_read", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text, nullable=True),
)


#: Senders (migration 0007): the mailboxes campaigns send from. ``email_key`` is the address
#: lower-cased, unique, so one address is one sender whatever its case.
senders = sa.Table(
    "senders",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("email", sa.Text, nullable=False),
    sa.Column("email_key", sa.String(320), nullable=False, unique=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("reply_to", sa.Text, nullable=True),
    # A mailer URL, credentials included, stored as given (masking is the services' business).
    sa.Column("transport", sa.Text, nullable=True),
    sa.Column("daily_cap", sa.Integer, nullable=False),
    sa.Column("min_gap_seconds", sa.Integer, nullable=False),
    sa.Column("timezone", sa.Text, nullable=False),
    sa.Column("warmup_start", sa.Integer, nullable=True),
    sa.Column("warmup_step", sa.Integer, nullable=True),
    sa.Column("warmup_from", sa.Date, nullable=True),
    # Its own mailbox (an IMAP URL, credentials included), signature and OAuth grant (a JSON
    # object, secrets included): migration 0008.
    sa.Column("imap", sa.Text, nullable=True),
    sa.Column("signature_text", sa.Text, nullable=True),
    sa.Column("signature_html", sa.Text, nullable=True),
    sa.Column("oauth", _json(), nullable=True),
)

#: One row per booked slot (migration 0007): the primary key (sender, slot start in epoch
#: milliseconds) refuses a second booking of a slot and serves the per-sender range reads;
#: ``task_id`` is unique (a task holds one booking). ``day`` is the sender-local day the slot
#: counts on, ``cap`` that day's cap as booked, ``recipient`` the compared address.
sender_bookings = sa.Table(
    "sender_bookings",
    metadata,
    sa.Column(
        "sender_id",
        sa.String(200),
        sa.ForeignKey("senders.id"),
        primary_key=True,
    ),
    sa.Column("at_ms", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("task_id", sa.String(200), nullable=False, unique=True),
    sa.Column("campaign_id", sa.String(64), nullable=False),
    sa.Column("day", sa.Date, nullable=False),
    sa.Column("recipient", sa.Text, nullable=False),
    sa.Column("cap", sa.Integer, nullable=False),
    sa.Column("sent", sa.Boolean, nullable=False, server_default=sa.false()),
)

#: Each sender-local day's counts (migration 0007): the row a booking locks and checks against
#: its cap, so concurrent bookers of one day queue on it.
sender_days = sa.Table(
    "sender_days",
    metadata,
    sa.Column(
        "sender_id",
        sa.String(200),
        sa.ForeignKey("senders.id"),
        primary_key=True,
    ),
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("planned", sa.Integer, nullable=False),
    sa.Column("sent", sa.Integer, nullable=False),
)

#: Sticky senders (migration 0007): the first sender each compared address was booked on.
#: No foreign key: the memory outlives a removed sender (the planner only uses a sticky sender
#: that is among the campaign's).
sender_contacts = sa.Table(
    "sender_contacts",
    metadata,
    sa.Column("recipient", sa.Text, primary_key=True),
    sa.Column("sender_id", sa.String(200), nullable=False),
)


#: Webhook endpoints (migration 0009): where events go, their signing secrets (stored as
#: made: they sign every delivery) and their delivery position (``cursor``, the change-log id
#: delivered up to, and the head event's failures).
webhook_endpoints = sa.Table(
    "webhook_endpoints",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("event_types", _json(), nullable=False),
    sa.Column("campaign_ids", _json(), nullable=False),
    sa.Column("enabled", sa.Boolean, nullable=False),
    sa.Column("disabled_reason", sa.Text, nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("secret", sa.Text, nullable=False),
    sa.Column("previous_secret", sa.Text, nullable=True),
    sa.Column("previous_secret_expires_at", UtcDateTime, nullable=True),
    sa.Column("cursor", sa.BigInteger, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("retry_at", UtcDateTime, nullable=True),
    sa.Column("failing_since", UtcDateTime, nullable=True),
)

#: The delivery log (migration 0009): one row per attempt, read per endpoint newest first,
#: pruned by time.
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column(
        "endpoint_id",
        sa.String(64),
        sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("event_id", sa.String(64), nullable=False),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("at", UtcDateTime, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("latency_ms", sa.Integer, nullable=False),
    sa.Column("status", sa.Integer, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("redelivery", sa.Boolean, nullable=False),
    sa.Index("ix_webhook_deliveries_endpoint_id_id", "endpoint_id", "id"),
    sa.Index("ix_webhook_deliveries_at", "at"),
)

#: Dead letters relayed into the change log (migration 0010), one row per letter id, written
#: in the transaction of the letter's ``dead_letter`` entry: the relay's idempotency key. Kept
#: for good: a letter id is never reused, and a row is a few dozen bytes per dead letter.
dead_letter_relays = sa.Table(
    "dead_letter_relays",
    metadata,
    sa.Column("letter_id", sa.String(128), primary_key=True),
    sa.Column("task_id", sa.String(128), nullable=False),
    sa.Column("failed_at", UtcDateTime, nullable=False),
)


def normalise_url(url: str) -> sa.URL:
    """``url`` as a SQLAlchemy URL; ``postgresql://`` means psycopg 3 (psycopg2 is not used)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        # The URL itself stays out of the message: it may hold a password.
        raise ValueError(
            "not a database URL; expected sqlite:///FILE or postgresql+psycopg://user@host/db"
        ) from exc
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in {"sqlite", "postgresql"}:
        raise ValueError(
            f"unsupported database URL scheme {parsed.drivername!r}; "
            "expected sqlite:///FILE or postgresql+psycopg://user@host:5432/db"
        )
    return parsed


def create_store_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for the task store (or its migrations) at ``url``.

    Extra keyword arguments go to :func:`sqlalchemy.create_engine`.
    """
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, **kwargs)
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("connect_args", {"connect_timeout": 10})
    return sa.create_engine(parsed, **kwargs)


def _sqlite_engine(url: sa.URL, **kwargs: Any) -> Engine:
    if url.database in {None, "", ":memory:"}:
        # Each pooled connection would get its own empty database, and WAL needs a file.
        raise ValueError("the SQLite task store needs a file: sqlite:///path/to/sendqueue.db")
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", BUSY_TIMEOUT_SECONDS)
    # Connections are handed between threads by the pool, never used by two at once.
    connect_args.setdefault("check_same_thread", False)
    engine = sa.create_engine(url, connect_args=connect_args, **kwargs)

    def _set_wal(cursor: Any) -> None:
        # Switching a fresh file to WAL can fail with "database is locked" at once, without
        # waiting on the busy timeout, while another process is opening the same file.
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        while True:
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module, which would otherwise open
        # every transaction with a plain (deferred) BEGIN of its own; see _on_begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first, so switching a fresh file to WAL waits for other openers.
            cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
            _set_wal(cursor)
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            cursor.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        if mode not in {"DEFERRED", "IMMEDIATE", "EXCLUSIVE"}:
            raise ValueError(f"unknown SQLite transaction mode {mode!r}")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine
