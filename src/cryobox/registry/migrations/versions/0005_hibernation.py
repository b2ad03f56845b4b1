"""Portable hibernation: sandboxes gain ``hibernation`` (``local`` | ``stored``), the template generation a stored
hibernation sits on, and the sandbox's ``egress`` (a sandbox woken on another agent keeps its network policy).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("hibernation", sa.String(32), nullable=True))
        batch.add_column(sa.Column("hibernation_generation", sa.String(255), nullable=True))
        batch.add_column(sa.Column("egress", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("egress")
        batch.drop_column("hibernation_generation")
        batch.drop_column("hibernation")
