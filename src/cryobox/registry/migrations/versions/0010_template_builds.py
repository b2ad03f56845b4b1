"""Recipe builds of templates: ``template_builds`` holds one row per build (its status, error and the step that
failed, tags, size, the build spec it ran), ``template_build_logs`` its log lines (capped per build, a marker line
when cut), and ``template_files`` which context blob (SHA-256 of its bytes) a workspace uploaded for a client's
own files hash (E2B's ``filesHash``), so a build can translate one into the other.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "template_builds",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("template", sa.String(255), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_step", sa.String(32), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("cpu", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("log_lines", sa.Integer(), nullable=False),
        sa.Column("log_truncated", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_template_builds")),
    )
    op.create_index(op.f("ix_template_builds_template"), "template_builds", ["template"])
    op.create_table(
        "template_build_logs",
        sa.Column("build_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("timestamp", sa.Double(), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("step", sa.String(32), nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"], ["template_builds.id"], name=op.f("fk_template_build_logs_build_id_template_builds")
        ),
        sa.PrimaryKeyConstraint("build_id", "seq", name=op.f("pk_template_build_logs")),
    )
    op.create_table(
        "template_files",
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("files_hash", sa.String(128), nullable=False),
        sa.Column("blob_sha256", sa.String(64), nullable=False),
        sa.Column("template", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "files_hash", name=op.f("pk_template_files")),
    )
    op.create_index(op.f("ix_template_files_blob_sha256"), "template_files", ["blob_sha256"])


def downgrade() -> None:
    op.drop_index(op.f("ix_template_files_blob_sha256"), table_name="template_files")
    op.drop_table("template_files")
    op.drop_table("template_build_logs")
    op.drop_index(op.f("ix_template_builds_template"), table_name="template_builds")
    op.drop_table("template_builds")
