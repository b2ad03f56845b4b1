"""Volumes: ``volumes`` (a workspace's named volumes, unique by name in it, on one host at a time; ``writer`` is
the sandbox holding the read-write attachment) and ``volume_attachments`` (which sandbox mounts which volume where,
read-only or not); ``workspace_quotas`` gain ``volumes`` and ``volume_bytes`` (NULL: the server default);
``snapshots`` gain ``volumes``, the mounts of the sandbox a snapshot was taken from (``[]`` for older ones).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("filesystem", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("writer", sa.String(128), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"], name=op.f("fk_volumes_workspace_id_workspaces")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_volumes")),
        sa.UniqueConstraint("workspace_id", "name", name="uq_volumes_workspace_id_name"),
    )
    op.create_index(op.f("ix_volumes_workspace_id"), "volumes", ["workspace_id"])
    op.create_index(op.f("ix_volumes_host"), "volumes", ["host"])
    op.create_table(
        "volume_attachments",
        sa.Column("volume_id", sa.String(128), nullable=False),
        sa.Column("sandbox_id", sa.String(128), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("read_only", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["volume_id"], ["volumes.id"], name=op.f("fk_volume_attachments_volume_id_volumes")),
        sa.PrimaryKeyConstraint("volume_id", "sandbox_id", name=op.f("pk_volume_attachments")),
    )
    op.create_index(op.f("ix_volume_attachments_sandbox_id"), "volume_attachments", ["sandbox_id"])
    with op.batch_alter_table("workspace_quotas") as batch:
        batch.add_column(sa.Column("volumes", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("volume_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("volumes", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("volumes")
    with op.batch_alter_table("workspace_quotas") as batch:
        batch.drop_column("volume_bytes")
        batch.drop_column("volumes")
    op.drop_index(op.f("ix_volume_attachments_sandbox_id"), table_name="volume_attachments")
    op.drop_table("volume_attachments")
    op.drop_index(op.f("ix_volumes_host"), table_name="volumes")
    op.drop_index(op.f("ix_volumes_workspace_id"), table_name="volumes")
    op.drop_table("volumes")
