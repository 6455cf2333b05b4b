"""initial: jobs, tags, uploads

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _when(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=True),
        sa.Column("progress", sa.Integer(), nullable=False),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_json", _json(), nullable=True),
        sa.Column("upload_sha256", sa.String(length=64), nullable=False),
        sa.Column("upload_filename", sa.String(length=255), nullable=False),
        sa.Column("upload_kind", sa.String(length=8), nullable=False),
        sa.Column("entrypoint", sa.String(length=512), nullable=False),
        sa.Column("input_spec", sa.Text(), nullable=True),
        sa.Column("input_sha256", sa.String(length=64), nullable=True),
        sa.Column("input_filename", sa.String(length=255), nullable=True),
        sa.Column("options", _json(), nullable=False),
        sa.Column("report_json", _json(), nullable=True),
        sa.Column("params", sa.BigInteger(), nullable=True),
        sa.Column("flops_forward", sa.BigInteger(), nullable=True),
        sa.Column("train_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("forward_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("findings_errors", sa.Integer(), nullable=False),
        sa.Column("findings_warnings", sa.Integer(), nullable=False),
        sa.Column("capture_method", sa.String(length=16), nullable=True),
        _when("created_at", nullable=False),
        _when("started_at"),
        _when("finished_at"),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=128), nullable=True),
        _when("heartbeat_at"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("slug"),
    )
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_index("ix_jobs_name", "jobs", ["name"])
    op.create_index("ix_jobs_status_id", "jobs", ["status", "id"])
    op.create_table(
        "uploads",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        _when("created_at", nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    op.create_table(
        "tags",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_tags_job_id", "tags", ["job_id"])
    op.create_index("ix_tags_key_value", "tags", ["key", "value"])


def downgrade() -> None:
    op.drop_table("tags")
    op.drop_table("uploads")
    op.drop_table("jobs")
