"""Initial task store: campaigns, recipients, tasks, change log, leases.

Revision ID: 0001
Revises:
Create Date: 2026-01-01

Written out by hand rather than from the application's metadata, so this revision keeps
producing the same schema when the metadata changes later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _json() -> sa.JSON:
    return sa.JSON(none_as_null=True)


def upgrade() -> None:
    _campaigns_and_recipients()
    _tasks()
    _change_log_and_leases()


def _campaigns_and_recipients() -> None:
    op.create_table(
        "campaigns",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("policy", _json(), nullable=False),
        sa.Column("from_addr", sa.Text(), nullable=False),
        sa.Column("reply_to", sa.Text(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=True),
        sa.Column("recipient_count", sa.Integer(), nullable=False),
        sa.Column("checkpoint", _json(), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_campaigns"),
    )
    op.create_index("ix_campaigns_created_at", "campaigns", ["created_at"])

    op.create_table(
        "recipients",
        sa.Column("campaign_id", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("html", sa.Text(), nullable=True),
        sa.Column("variables", _json(), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"],
            ["campaigns.id"],
            name="fk_recipients_campaign_id_campaigns",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("campaign_id", "position", name="pk_recipients"),
    )


def _tasks() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(200), nullable=False),
        sa.Column("campaign_id", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("html", sa.Text(), nullable=True),
        sa.Column("send_at", _utc(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_at", _utc(), nullable=True),
        sa.Column("sent_at", _utc(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"],
            ["campaigns.id"],
            name="fk_tasks_campaign_id_campaigns",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tasks"),
    )
    op.create_index(
        "ix_tasks_campaign_id_state_position", "tasks", ["campaign_id", "state", "position"]
    )
    op.create_index(
        "ix_tasks_campaign_id_position", "tasks", ["campaign_id", "position"], unique=True
    )
    op.create_index("ix_tasks_state_send_at_id", "tasks", ["state", "send_at", "id"])
    op.create_index("ix_tasks_state_claimed_at", "tasks", ["state", "claimed_at"])


def _change_log_and_leases() -> None:
    op.create_table(
        "change_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("campaign_id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("at", _utc(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["campaign_id"],
            ["campaigns.id"],
            name="fk_change_log_campaign_id_campaigns",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_change_log"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_change_log_campaign_id_id", "change_log", ["campaign_id", "id"])

    op.create_table(
        "leases",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("expires_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )


def downgrade() -> None:
    op.drop_table("leases")
    op.drop_index("ix_change_log_campaign_id_id", table_name="change_log")
    op.drop_table("change_log")
    op.drop_index("ix_tasks_state_claimed_at", table_name="tasks")
    op.drop_index("ix_tasks_state_send_at_id", table_name="tasks")
    op.drop_index("ix_tasks_campaign_id_position", table_name="tasks")
    op.drop_index("ix_tasks_campaign_id_state_position", table_name="tasks")
    op.drop_table("tasks")
    op.drop_table("recipients")
    op.drop_index("ix_campaigns_created_at", table_name="campaigns")
    op.drop_table("campaigns")
