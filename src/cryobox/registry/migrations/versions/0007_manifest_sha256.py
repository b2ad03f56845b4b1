"""Manifests pinned in the registry: snapshots gain ``manifest_sha256`` and sandboxes
``hibernation_manifest_sha256``, the sha256 of the manifest their stored copy was uploaded with (an import on
another agent refuses any other bytes). NULL for rows from before: those are trusted as fetched, with a warning.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("manifest_sha256", sa.String(64), nullable=True))
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("hibernation_manifest_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("hibernation_manifest_sha256")
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("manifest_sha256")
