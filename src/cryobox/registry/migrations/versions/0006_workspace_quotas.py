"""Per-workspace quotas: ``workspace_quotas`` holds a workspace's own limits (sandboxes, vCPUs, memory, snapshot
bytes, custom templates, default and maximum TTL); a NULL column, or no row, means the server's default.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workspace_quotas",
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("sandboxes", sa.Integer(), nullable=True),
        sa.Column("vcpus", sa.Integer(), nullable=True),
        sa.Column("memory_mib", sa.BigInteger(), nullable=True),
        sa.Column("snapshot_bytes", sa.BigInteger(), nullable=True),
        sa.Column("templates", sa.Integer(), nullable=True),
        sa.Column("default_ttl_s", sa.Integer(), nullable=True),
        sa.Column("max_ttl_s", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"], ["workspaces.id"], name=op.f("fk_workspace_quotas_workspace_id_workspaces")
        ),
        sa.PrimaryKeyConstraint("workspace_id", name=op.f("pk_workspace_quotas")),
    )


def downgrade() -> None:
    op.drop_table("workspace_quotas")
