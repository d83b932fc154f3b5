"""Follow-up marks: a sent step whose sequence's next step is still to be made.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

- ``tasks.follow_up`` BOOLEAN NOT NULL DEFAULT false: the send worker's finish sets it on a
  step that has a next one, and the follow-up maker clears it once that step is made
  (docs/decisions/0008-follow-ups-in-batches.md). Every existing row reads back unmarked: a
  next step a crash kept from being made before this revision is still found by the
  reconciler's sweep of sent steps.
- ``ix_tasks_follow_up``: a partial index on the marked rows only, so finding a campaign's
  marks, and the completion check, read a handful of index entries however large it is.

The downgrade drops both: the marks it loses are found by that same sweep.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A column with a constant default: ADD COLUMN works in place on both databases.
    op.add_column(
        "tasks",
        sa.Column("follow_up", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index(
        "ix_tasks_follow_up",
        "tasks",
        ["campaign_id", "position", "step"],
        sqlite_where=sa.text("follow_up = 1"),
        postgresql_where=sa.text("follow_up"),
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_follow_up", table_name="tasks")
    # Plain DROP COLUMN (SQLite 3.35+), as in 0011: no index names the column any more.
    op.drop_column("tasks", "follow_up")
