"""tokens: API tokens (hashed) and the upload events of the per-identity rate limit

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _when(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        _when("created_at", nullable=False),
        _when("last_used_at"),
        _when("revoked_at"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"])
    op.create_table(
        "upload_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=300), nullable=False),
        _when("at", nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_upload_events_key_at", "upload_events", ["key", "at"])


def downgrade() -> None:
    op.drop_table("upload_events")
    op.drop_table("api_tokens")
