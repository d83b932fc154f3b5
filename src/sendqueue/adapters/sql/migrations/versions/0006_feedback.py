"""The feedback loop: task outcomes, an address index, soft bounces, mailbox cursors.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

- ``tasks.outcome``, ``outcome_detail``, ``outcome_at`` (NULL for existing rows: what happened
  after sending was not recorded then);
- ``tasks.email_key``, the address's compared form (``key_of_normalized``: Python's casefold,
  which SQL's ``lower()`` is not), indexed with the state for ``FeedbackStore.tasks_for``.
  Existing rows are filled here in batches, in Python;
- ``campaigns.stop_on_reply`` ('sender') and ``campaigns.unsubscribe_footer`` (false);
- ``soft_bounces`` (address, message key, time) and ``feedback_cursors`` (mailbox ->
  UIDVALIDITY, UID).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Tasks read and updated per round of the backfill (bounded memory on large tables).
_BATCH = 2000


def _backfill_email_keys() -> None:
    """``email_key = email.casefold()`` for every row, in id order, ``_BATCH`` rows a round.

    The same as :func:`sendqueue.domain.suppression.key_of_normalized` (kept in step by the
    migration test); the migration does not import the application's domain."""
    conn = op.get_bind()
    select = sa.text("SELECT id, email FROM tasks WHERE id > :after ORDER BY id LIMIT :n")
    update = sa.text("UPDATE tasks SET email_key = :key WHERE id = :id")
    after = ""
    while True:
        found = conn.execute(select, {"after": after, "n": _BATCH}).all()
        if not found:
            return
        conn.execute(update, [{"id": id_, "key": email.casefold()} for id_, email in found])
        after = found[-1][0]


def upgrade() -> None:
    # Nullable columns, or with a default: ADD COLUMN works in place on both databases.
    op.add_column("tasks", sa.Column("outcome", sa.String(16), nullable=True))
    op.add_column("tasks", sa.Column("outcome_detail", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("outcome_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tasks", sa.Column("email_key", sa.String(320), nullable=True))
    _backfill_email_keys()
    op.create_index("ix_tasks_email_key_state", "tasks", ["email_key", "state"])
    op.add_column(
        "campaigns",
        sa.Column("stop_on_reply", sa.String(16), nullable=False, server_default="sender"),
    )
    op.add_column(
        "campaigns",
        sa.Column("unsubscribe_footer", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "soft_bounces",
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("key", sa.String(1000), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("email", "key", name="pk_soft_bounces"),
    )
    op.create_table(
        "feedback_cursors",
        sa.Column("mailbox", sa.String(1000), nullable=False),
        sa.Column("uidvalidity", sa.BigInteger(), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("mailbox", name="pk_feedback_cursors"),
    )


def downgrade() -> None:
    op.drop_table("feedback_cursors")
    op.drop_table("soft_bounces")
    op.drop_index("ix_tasks_email_key_state", table_name="tasks")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch mode: copying ``campaigns``
    # would drop it, and its foreign keys would cascade to every task.
    for column in ("unsubscribe_footer", "stop_on_reply"):
        op.drop_column("campaigns", column)
    for column in ("email_key", "outcome_at", "outcome_detail", "outcome"):
        op.drop_column("tasks", column)
