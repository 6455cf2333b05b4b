"""jobs.result_key and jobs.reused_from: a repeated upload answered from a done report

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("result_key", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("reused_from", sa.String(length=32), nullable=True))
        batch.create_index("ix_jobs_result_key", ["result_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_result_key")
        batch.drop_column("reused_from")
        batch.drop_column("result_key")
