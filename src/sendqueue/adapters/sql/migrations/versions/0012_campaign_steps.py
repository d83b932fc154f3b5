"""Campaign steps: a campaign's sequence, stored as its steps' templates.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-12

- nullable ``campaigns.steps``: a JSON array of the steps, step 1 first, each with its subject,
  text and html templates, its delay after the previous step and whether it starts a new
  thread. NULL for a campaign stored before: its one email's templates were rendered into its
  recipients at import, as before.

The downgrade refuses a database holding a campaign of more than one step (alembic's
CommandError, reported as InvalidField ``revision``): its later steps are made from these
templates as each step before is sent, so dropping them would end every such sequence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from alembic.util import CommandError

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("campaigns", sa.Column("steps", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    rows = op.get_bind().execute(sa.text("SELECT steps FROM campaigns WHERE steps IS NOT NULL"))
    # SQLite gives the JSON as text, PostgreSQL's driver decodes it
    steps = [json.loads(v) if isinstance(v, str) else v for (v,) in rows]
    count = sum(1 for s in steps if isinstance(s, list) and len(s) > 1)
    if count:
        raise CommandError(
            f"{count} campaign(s) have steps after the first, which would be lost: delete "
            "them before downgrading"
        )
    # Plain ALTER TABLE ... DROP COLUMN, not batch mode: copying ``campaigns`` would drop it,
    # and its foreign keys would cascade to every task (as in 0006 and 0007).
    op.drop_column("campaigns", "steps")
