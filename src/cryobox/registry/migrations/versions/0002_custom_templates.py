"""Custom templates: owner workspace, build spec and last error.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("templates") as batch:
        batch.add_column(sa.Column("workspace_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("spec", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("templates") as batch:
        batch.drop_column("error")
        batch.drop_column("spec")
        batch.drop_column("workspace_id")
