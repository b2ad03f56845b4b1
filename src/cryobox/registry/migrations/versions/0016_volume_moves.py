"""Volumes that move between hosts through the object store: the last stored copy (``stored_sha256``: the sha256
of its manifest, which a fetch checks; ``stored_at``) and the move lease (``move_token``, ``move_target``,
``move_started_at``): taken by one conditional update, so two replicas never move one volume at once, and no
attachment is recorded while it is held.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-12 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("stored_sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("stored_at", sa.Double(), nullable=True))
        batch.add_column(sa.Column("move_token", sa.String(64), nullable=True))
        batch.add_column(sa.Column("move_target", sa.String(255), nullable=True))
        batch.add_column(sa.Column("move_started_at", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        for name in ("move_started_at", "move_target", "move_token", "stored_at", "stored_sha256"):
            batch.drop_column(name)
