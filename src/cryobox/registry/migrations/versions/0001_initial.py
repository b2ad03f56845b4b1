"""Initial schema: workspaces, api_keys, templates, sandboxes, snapshots.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workspaces",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
        sa.UniqueConstraint("name", name=op.f("uq_workspaces_name")),
    )

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"], name=op.f("fk_api_keys_workspace_id_workspaces")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("hash", name=op.f("uq_api_keys_hash")),
    )
    op.create_index(op.f("ix_api_keys_prefix"), "api_keys", ["prefix"])
    op.create_index(op.f("ix_api_keys_workspace_id"), "api_keys", ["workspace_id"])

    op.create_table(
        "templates",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("generation", sa.String(255), nullable=False),
        sa.Column("cpu", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_templates")),
    )

    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("template", sa.String(255), nullable=False),
        sa.Column("cpu", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("from_snapshot", sa.String(128), nullable=True),
        sa.Column("boot_ms", sa.Double(), nullable=False),
        sa.Column("boot_mode", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("persistent", sa.Boolean(), nullable=False),
        sa.Column("ttl_seconds", sa.Integer(), nullable=True),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("last_active_at", sa.Double(), nullable=False),
        sa.Column("vm_id", sa.String(128), nullable=True),
        sa.Column("guest_ip", sa.String(64), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"], name=op.f("fk_sandboxes_workspace_id_workspaces")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandboxes")),
    )
    op.create_index(op.f("ix_sandboxes_status"), "sandboxes", ["status"])
    op.create_index(op.f("ix_sandboxes_workspace_id"), "sandboxes", ["workspace_id"])

    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("sandbox_id", sa.String(128), nullable=True),
        sa.Column("template", sa.String(255), nullable=False),
        sa.Column("parent_id", sa.String(128), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("pause_ms", sa.Double(), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("retain", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("orphaned_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"], name=op.f("fk_snapshots_workspace_id_workspaces")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshots")),
    )
    op.create_index(op.f("ix_snapshots_sandbox_id"), "snapshots", ["sandbox_id"])
    op.create_index(op.f("ix_snapshots_workspace_id"), "snapshots", ["workspace_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_snapshots_workspace_id"), table_name="snapshots")
    op.drop_index(op.f("ix_snapshots_sandbox_id"), table_name="snapshots")
    op.drop_table("snapshots")
    op.drop_index(op.f("ix_sandboxes_workspace_id"), table_name="sandboxes")
    op.drop_index(op.f("ix_sandboxes_status"), table_name="sandboxes")
    op.drop_table("sandboxes")
    op.drop_table("templates")
    op.drop_index(op.f("ix_api_keys_workspace_id"), table_name="api_keys")
    op.drop_index(op.f("ix_api_keys_prefix"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("workspaces")
