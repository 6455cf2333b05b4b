"""blobs: the database blob store (content-addressed files in 1 MiB chunks); jobs indexed
by the files they use (deleting a report or gc asks which jobs still use a blob)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("chunk_count", sa.Integer(), nullable=False),
        sa.Column("touched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    op.create_table(
        "blob_chunks",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["sha256"], ["blobs.sha256"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sha256", "seq"),
    )
    op.create_index("ix_jobs_upload_sha256", "jobs", ["upload_sha256"])
    op.create_index("ix_jobs_input_sha256", "jobs", ["input_sha256"])


def downgrade() -> None:
    op.drop_index("ix_jobs_input_sha256", table_name="jobs")
    op.drop_index("ix_jobs_upload_sha256", table_name="jobs")
    op.drop_table("blob_chunks")
    op.drop_table("blobs")
