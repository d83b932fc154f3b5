"""Task steps: which step of its campaign's sequence each task's email is.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-12

- ``tasks.step`` INTEGER NOT NULL DEFAULT 1: every existing task reads back as step 1, as
  before sequences;
- the unique index on ``(campaign_id, position)`` becomes one on ``(campaign_id, position,
  step)``: a recipient gets one task per step. It still serves a campaign's tasks in position
  order.

The downgrade refuses a database holding tasks of a later step (alembic's CommandError, which
``migrate`` reports as InvalidField ``revision``): dropping the column would leave a recipient
with two tasks the old index cannot hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from alembic.util import CommandError

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A column with a default: ADD COLUMN works in place on both databases (no table copy).
    op.add_column(
        "tasks", sa.Column("step", sa.Integer(), nullable=False, server_default=sa.text("1"))
    )
    op.drop_index("ix_tasks_campaign_id_position", table_name="tasks")
    op.create_index(
        "ix_tasks_campaign_id_position_step",
        "tasks",
        ["campaign_id", "position", "step"],
        unique=True,
    )


def downgrade() -> None:
    later = op.get_bind().execute(sa.text("SELECT count(*) FROM tasks WHERE step > 1"))
    count = later.scalar_one()
    if count:
        raise CommandError(
            f"{count} tasks belong to a step after the first: delete them before downgrading"
        )
    op.drop_index("ix_tasks_campaign_id_position_step", table_name="tasks")
    op.create_index(
        "ix_tasks_campaign_id_position", "tasks", ["campaign_id", "position"], unique=True
    )
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch mode, as in 0007: copying
    # ``tasks`` is needless once no index names the column.
    op.drop_column("tasks", "step")
