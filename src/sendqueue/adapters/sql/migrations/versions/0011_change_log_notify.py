"""Change-log notifications: readers of the live stream are woken on commit (PostgreSQL only).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

- ``sq_change_log_notify()``, a statement-level ``AFTER INSERT`` trigger on ``change_log``:
  a statement that inserted at least one entry runs ``NOTIFY sendqueue_changes`` in its
  transaction, which the server delivers to listeners when (and only if) it commits. Every
  write path is covered, whichever statement inserts the entries; the notifications of one
  transaction fold into one (same channel, same empty payload).

SQLite needs nothing: its store wakes readers of its own process itself, and watches the file
for other processes' commits (``sendqueue.adapters.sql.signal``).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = r"""
CREATE FUNCTION sq_change_log_notify() RETURNS trigger LANGUAGE plpgsql AS $notify$
BEGIN
  IF EXISTS (SELECT 1 FROM sq_added) THEN
    PERFORM pg_notify('sendqueue_changes', '');
  END IF;
  RETURN NULL;
END
$notify$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_FUNCTION)
    op.execute(
        "CREATE TRIGGER sq_change_log_notify AFTER INSERT ON change_log"
        " REFERENCING NEW TABLE AS sq_added"
        " FOR EACH STATEMENT EXECUTE FUNCTION sq_change_log_notify()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER sq_change_log_notify ON change_log")
    op.execute("DROP FUNCTION sq_change_log_notify()")
