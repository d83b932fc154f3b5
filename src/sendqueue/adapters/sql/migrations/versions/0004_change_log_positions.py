"""PostgreSQL: change-log ids in an order nothing can commit behind, without a global lock.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

PostgreSQL only (SQLite serialises its writers and keeps plain autoincrement ids):

- ``change_log.id`` is drawn by ``sq_change_log_id()`` instead of the sequence:
  ``((xid + base) << 22) | rank``, where ``xid`` is the writing transaction's
  (``pg_current_xact_id()``) and ``rank`` the entry's place in it (0, 1, ...; a
  transaction-local setting counts). Id order is (transaction, rank) order.
- ``sq_change_log_horizon()`` is ``(oldest + base) << 22``, ``oldest`` being the oldest
  transaction in flight at the statement's snapshot (its xmin), skipping those running on a
  backend of another database of the cluster, which cannot write here (the snapshot's xmax if
  none is left). Readers return ids below it only: no entry can commit behind them later.
- ``base`` is chosen by ``sq_change_log_rebase()`` so that every new id exceeds every id
  already stored: a client resuming after an old id neither misses nor replays an entry.
  ``sendqueue db migrate-to`` calls it again after copying ids in.

Limits (``sq_change_log_id()`` raises past them): 4,194,304 entries per transaction; xid + base
below 2**41 (2.2e12 transactions of the cluster), so ids stay within a signed 64-bit integer.
Why: docs/performance-history.md, "the change log without a global lock".
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rebase writes both functions with ``base`` as a literal (no lookup per row or read).
_REBASE = r"""
CREATE FUNCTION sq_change_log_rebase() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $rebase$
DECLARE
  newest bigint;
  horizon bigint;
  base bigint;
BEGIN
  -- Writers in flight end first; later ones (and those queued here) have an xid >= horizon.
  LOCK TABLE change_log IN EXCLUSIVE MODE;
  SELECT max(id) INTO newest FROM change_log;
  horizon := pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
  base := greatest(0, (coalesce(newest, 0) >> 22) + 1 - horizon);
  EXECUTE format($fn$
    CREATE OR REPLACE FUNCTION sq_change_log_id() RETURNS bigint
    LANGUAGE plpgsql VOLATILE AS $id$
    DECLARE
      rank bigint := coalesce(
        nullif(current_setting('sendqueue.change_log_rank', true), ''), '0')::bigint;
      slot bigint := pg_current_xact_id()::text::bigint + %s;
    BEGIN
      IF rank >= 4194304 THEN
        RAISE EXCEPTION 'one transaction may write at most 4194304 change-log entries'
          USING ERRCODE = 'program_limit_exceeded';
      END IF;
      IF slot >= 2199023255552 THEN
        RAISE EXCEPTION 'change-log ids are exhausted (transaction id %% plus base %s)',
          slot - %s USING ERRCODE = 'program_limit_exceeded';
      END IF;
      PERFORM set_config('sendqueue.change_log_rank', (rank + 1)::text, true);
      RETURN (slot << 22) | rank;
    END $id$$fn$, base, base, base);
  -- The oldest transaction in flight at the statement's snapshot that may write here: any,
  -- except those seen running on a backend of another database (they cannot).
  EXECUTE format($fn$
    CREATE OR REPLACE FUNCTION sq_change_log_horizon() RETURNS bigint
    LANGUAGE sql STABLE AS $h$
      SELECT (coalesce(
        (SELECT min(x) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
          WHERE xid(x) NOT IN (
            SELECT backend_xid FROM pg_stat_activity
            WHERE backend_xid IS NOT NULL AND datname IS DISTINCT FROM current_database())),
        pg_snapshot_xmax(pg_current_snapshot()))::text::bigint + %s) << 22
    $h$$fn$, base);
  RETURN base;
END $rebase$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_REBASE)
    op.execute("SELECT sq_change_log_rebase()")
    op.execute("ALTER TABLE change_log ALTER COLUMN id SET DEFAULT sq_change_log_id()")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # Back to the sequence, continuing after the highest id.
    op.execute(
        "ALTER TABLE change_log ALTER COLUMN id SET DEFAULT nextval('change_log_id_seq'::regclass)"
    )
    op.execute(
        "SELECT setval('change_log_id_seq', max(id)) FROM change_log HAVING max(id) IS NOT NULL"
    )
    op.execute("DROP FUNCTION sq_change_log_id()")
    op.execute("DROP FUNCTION sq_change_log_horizon()")
    op.execute("DROP FUNCTION sq_change_log_rebase()")
