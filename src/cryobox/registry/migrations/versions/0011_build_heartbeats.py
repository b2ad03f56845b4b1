"""Build heartbeats: ``template_builds`` gains ``updated_at``, which the control plane running a build refreshes
every few seconds while it streams (and on every change of the record). A ``waiting``/``building`` record not
refreshed for longer than the stale bound belonged to a control plane that stopped; any replica reading it fails
it as interrupted. Rows from before take their last known time (``finished_at``, else ``created_at``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-12 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("template_builds") as batch:
        batch.add_column(sa.Column("updated_at", sa.Double(), nullable=False, server_default="0"))
    op.execute(sa.text("UPDATE template_builds SET updated_at = COALESCE(finished_at, created_at)"))


def downgrade() -> None:
    with op.batch_alter_table("template_builds") as batch:
        batch.drop_column("updated_at")
