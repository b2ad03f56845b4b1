"""Web console sessions: ``console_sessions`` holds one row per console login, keyed by the SHA-256 of the
session cookie's random token (the token itself is never stored), bound to the API key that logged in, with a
sliding expiry and the time a logout ended it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(128), nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["key_id"], ["api_keys.id"], name=op.f("fk_console_sessions_key_id_api_keys")),
        sa.ForeignKeyConstraint(
            ["workspace_id"], ["workspaces.id"], name=op.f("fk_console_sessions_workspace_id_workspaces")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )
    op.create_index(op.f("ix_console_sessions_key_id"), "console_sessions", ["key_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_console_sessions_key_id"), table_name="console_sessions")
    op.drop_table("console_sessions")
