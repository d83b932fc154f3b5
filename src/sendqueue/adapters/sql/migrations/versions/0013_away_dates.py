"""Return dates: what an out-of-office notice of a campaign's recipient named.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05

- ``away_dates``: one row per (campaign, position) with the return date (``until``) and when
  the notice came (``at``); the follow-up maker makes the recipient's next step no earlier
  than that date. New table: existing rows are untouched; the downgrade drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "away_dates",
        sa.Column("campaign_id", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("until", sa.Date, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("away_dates")
