"""Sender mailboxes: each sender's own IMAP mailbox, signature and OAuth grant, and what the
last pass over each mailbox saw.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

- ``senders.imap`` (an IMAP URL, credentials included; NULL: none), ``signature_text``
  (NULL: none), ``signature_html`` and ``oauth`` (a JSON object: token endpoint, client,
  refresh token; NULL: password sign-in);
- ``feedback_cursors.polled_at``, ``messages_read`` (0) and ``last_error``: a mailbox's state
  as the Senders page and ``sender show`` give it.

Existing rows read back as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns, or with a default: ADD COLUMN works in place on both databases.
    op.add_column("senders", sa.Column("imap", sa.Text(), nullable=True))
    op.add_column("senders", sa.Column("signature_text", sa.Text(), nullable=True))
    op.add_column("senders", sa.Column("signature_html", sa.Text(), nullable=True))
    op.add_column("senders", sa.Column("oauth", sa.JSON(none_as_null=True), nullable=True))
    op.add_column(
        "feedback_cursors", sa.Column("polled_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "feedback_cursors",
        sa.Column("messages_read", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column("feedback_cursors", sa.Column("last_error", sa.Text(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN in place (SQLite 3.35+): a batch copy of ``senders`` would
    # drop the table that bookings reference, which SQLite's foreign keys refuse.
    for table, column in (
        ("feedback_cursors", "last_error"),
        ("feedback_cursors", "messages_read"),
        ("feedback_cursors", "polled_at"),
        ("senders", "oauth"),
        ("senders", "signature_html"),
        ("senders", "signature_text"),
        ("senders", "imap"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
