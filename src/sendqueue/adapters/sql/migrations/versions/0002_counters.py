"""Named counters (TaskStore.counter): the web's session generation, bumped by logout.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

A new one-row-per-counter table; existing data is untouched, and a missing row reads as 0, so
an upgraded database starts at generation 0 like a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "counters",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_counters"),
    )


def downgrade() -> None:
    op.drop_table("counters")
