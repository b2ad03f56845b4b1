"""The registry's identity: ``registry_meta`` (key -> value) holding ``registry_id``, a random id made once, by
which the registry announces itself in the object store and claims what it stores there (``owners/``), so that
``cryobox gc --store`` can tell a stored snapshot whose registry is gone from one a live registry lists.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 22:30:00
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "registry_meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_registry_meta")),
    )
    op.bulk_insert(table, [{"key": "registry_id", "value": uuid.uuid4().hex}])


def downgrade() -> None:
    op.drop_table("registry_meta")
