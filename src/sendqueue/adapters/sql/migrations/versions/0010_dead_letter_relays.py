"""Dead-letter relays: the letters the relay has copied into the change log.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-11

- ``dead_letter_relays``: one row per dead letter (``letter_id``, the execution layer's id),
  written in the same transaction as the letter's ``dead_letter`` change-log entry, so a
  letter is relayed once however often the relay meets it; ``task_id`` and ``failed_at``
  say which task's invocation failed, and when.

A new table only: existing rows are untouched. Letters still waiting in the dead-letter queue
at the upgrade have no row yet, so the relay reports each of them once more (a new event id).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dead_letter_relays",
        sa.Column("letter_id", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("letter_id", name="pk_dead_letter_relays"),
    )


def downgrade() -> None:
    op.drop_table("dead_letter_relays")
