"""The Alembic history builds the schema the models describe, and unwinds completely."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from controlplane.db.base import Base
from controlplane.db.migrate import downgrade, upgrade


def test_upgrade_to_head_matches_models_and_downgrade_to_base_empties(empty_database_url):
    upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
            assert diff == [], f"models and migrations disagree: {diff}"
            tables = set(inspect(conn).get_table_names())
        assert {"providers", "pools", "clusters", "deployments", "api_tokens"} <= tables

        downgrade(empty_database_url)
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
