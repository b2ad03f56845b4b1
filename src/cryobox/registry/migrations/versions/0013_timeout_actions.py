"""Timeout actions: ``sandboxes`` gain ``on_timeout`` (``kill``, as every sandbox before, or ``hibernate``),
``auto_wake`` (true, as before: any request wakes a hibernated sandbox) and ``hibernated_at`` (NULL: the paused
retention stamps rows hibernated before this revision when it first sees them); ``workspace_quotas`` gain
``hibernated`` (NULL: the server default), the number of hibernated sandboxes a workspace may keep.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("on_timeout", sa.String(16), nullable=False, server_default="kill"))
        batch.add_column(sa.Column("auto_wake", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("hibernated_at", sa.Double(), nullable=True))
    with op.batch_alter_table("workspace_quotas") as batch:
        batch.add_column(sa.Column("hibernated", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workspace_quotas") as batch:
        batch.drop_column("hibernated")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("hibernated_at")
        batch.drop_column("auto_wake")
        batch.drop_column("on_timeout")
