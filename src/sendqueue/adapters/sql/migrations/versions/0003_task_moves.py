"""Each task keeps its first planned instant, how often it was moved and why.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Three columns on ``tasks``: ``planned_at`` (existing rows: their ``send_at``, the best record
of what was planned), ``moves`` (0) and ``moved_reason`` (NULL).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable, or with a default) works in place on both databases.
    op.add_column("tasks", sa.Column("planned_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "tasks", sa.Column("moves", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("tasks", sa.Column("moved_reason", sa.Text(), nullable=True))
    op.execute("UPDATE tasks SET planned_at = send_at")


def downgrade() -> None:
    # SQLite drops columns by copying the table (batch mode).
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("moved_reason")
        batch.drop_column("moves")
        batch.drop_column("planned_at")
