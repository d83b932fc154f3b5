"""Senders: mailboxes, the slots their sends book, and who sent to whom.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

- ``senders``: one row per mailbox, its address unique case-insensitively (``email_key``, the
  address lower-cased), its transport stored as given;
- ``sender_bookings``: one row per booked slot, keyed (sender, slot start in epoch ms), one per
  task (``task_id`` unique), with its sender-local day, the day's cap as booked and whether it
  was sent;
- ``sender_days``: each sender-local day's planned and sent counts, the row a booking locks;
- ``sender_contacts``: the first sender each compared address was booked on (sticky senders);
- nullable ``campaigns.sender_ids`` (NULL: no senders, the campaign's ``from_addr``) and
  ``campaigns.local_time`` (false), ``recipients.timezone``, ``tasks.sender_id``,
  ``tasks.sender`` and ``tasks.timezone`` (NULL: the campaign's). Existing rows read back as
  before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns, or with a default: ADD COLUMN works in place on both databases.
    op.add_column("campaigns", sa.Column("sender_ids", sa.JSON(none_as_null=True), nullable=True))
    op.add_column(
        "campaigns",
        sa.Column("local_time", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column("recipients", sa.Column("timezone", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("sender_id", sa.String(200), nullable=True))
    op.add_column("tasks", sa.Column("sender", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("timezone", sa.Text(), nullable=True))
    op.create_table(
        "senders",
        sa.Column("id", sa.String(200), nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("email_key", sa.String(320), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("reply_to", sa.Text(), nullable=True),
        sa.Column("transport", sa.Text(), nullable=True),
        sa.Column("daily_cap", sa.Integer(), nullable=False),
        sa.Column("min_gap_seconds", sa.Integer(), nullable=False),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("warmup_start", sa.Integer(), nullable=True),
        sa.Column("warmup_step", sa.Integer(), nullable=True),
        sa.Column("warmup_from", sa.Date(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_senders"),
        sa.UniqueConstraint("email_key", name="uq_senders_email_key"),
    )
    op.create_table(
        "sender_bookings",
        sa.Column("sender_id", sa.String(200), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("campaign_id", sa.String(64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("cap", sa.Integer(), nullable=False),
        sa.Column("sent", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.ForeignKeyConstraint(
            ["sender_id"], ["senders.id"], name="fk_sender_bookings_sender_id_senders"
        ),
        sa.PrimaryKeyConstraint("sender_id", "at_ms", name="pk_sender_bookings"),
        sa.UniqueConstraint("task_id", name="uq_sender_bookings_task_id"),
    )
    op.create_table(
        "sender_days",
        sa.Column("sender_id", sa.String(200), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("planned", sa.Integer(), nullable=False),
        sa.Column("sent", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["sender_id"], ["senders.id"], name="fk_sender_days_sender_id_senders"
        ),
        sa.PrimaryKeyConstraint("sender_id", "day", name="pk_sender_days"),
    )
    op.create_table(
        "sender_contacts",
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("sender_id", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("recipient", name="pk_sender_contacts"),
    )


def downgrade() -> None:
    op.drop_table("sender_contacts")
    op.drop_table("sender_days")
    op.drop_table("sender_bookings")
    op.drop_table("senders")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch mode: copying ``campaigns``
    # would drop it, and its foreign keys would cascade to every task (as in 0006).
    for column in ("timezone", "sender", "sender_id"):
        op.drop_column("tasks", column)
    op.drop_column("recipients", "timezone")
    for column in ("local_time", "sender_ids"):
        op.drop_column("campaigns", column)
