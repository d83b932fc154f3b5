"""The suppression list, and why a task was cancelled.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``tasks.reason`` (NULL for existing rows: nobody said why) and the ``suppressions`` table: one
row per address in its compared form, with its reason, the task it came from and when.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable ADD COLUMN works in place on both databases.
    op.add_column("tasks", sa.Column("reason", sa.Text(), nullable=True))
    op.create_table(
        "suppressions",
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("email", name="pk_suppressions"),
    )


def downgrade() -> None:
    op.drop_table("suppressions")
    # SQLite drops columns by copying the table (batch mode).
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("reason")
