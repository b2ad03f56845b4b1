"""Network policy by name: ``snapshots`` gain ``egress``, the network policy of the sandbox a snapshot was taken
from (a create from the snapshot that names no network inherits it). NULL: nothing allowed, as for snapshots
from before. No data changes: ``sandboxes.egress`` keeps its JSON column, which now holds a policy mapping
(``EgressPolicy``); the list of CIDRs older versions wrote there reads as a policy allowing exactly those.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-14 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("egress", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("egress")
