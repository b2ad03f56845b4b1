"""Snapshot sizes a user sees: snapshots gain ``unique_bytes`` (what only the snapshot holds: the memory pages it
changed from its parent image, its device state and its disk overlay) and ``shared_bytes`` (the memory it shares
with its parent image: a template generation or another snapshot). ``size_bytes`` stays. Rows from before count
everything as unique (``unique_bytes = size_bytes``, ``shared_bytes = 0``), as their manifests do.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("unique_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("shared_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    op.execute(sa.text("UPDATE snapshots SET unique_bytes = size_bytes"))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("shared_bytes")
        batch.drop_column("unique_bytes")
