"""Fleet: agents and reservations tables; snapshots gain host, location and generation; sandboxes.host indexed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("heartbeat_at", sa.Double(), nullable=False),
        sa.Column("registered_at", sa.Double(), nullable=False),
        sa.Column("capacity", sa.JSON(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_agents")),
    )

    op.create_table(
        "reservations",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("agent", sa.String(255), nullable=False),
        sa.Column("sandbox_id", sa.String(128), nullable=True),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reservations")),
    )
    op.create_index(op.f("ix_reservations_agent"), "reservations", ["agent"])
    op.create_index(op.f("ix_reservations_expires_at"), "reservations", ["expires_at"])

    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("host", sa.String(255), nullable=False, server_default=""))
        batch.add_column(sa.Column("location", sa.String(32), nullable=False, server_default="local"))
        batch.add_column(sa.Column("generation", sa.String(255), nullable=True))

    op.create_index(op.f("ix_sandboxes_host"), "sandboxes", ["host"])


def downgrade() -> None:
    op.drop_index(op.f("ix_sandboxes_host"), table_name="sandboxes")
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("generation")
        batch.drop_column("location")
        batch.drop_column("host")
    op.drop_index(op.f("ix_reservations_expires_at"), table_name="reservations")
    op.drop_index(op.f("ix_reservations_agent"), table_name="reservations")
    op.drop_table("reservations")
    op.drop_table("agents")
