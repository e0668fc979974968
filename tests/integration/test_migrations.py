"""The Alembic history builds the schema the models describe, and unwinds completely."""

from __future__ import annotations

import json

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

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


OLD_AUTOSCALING = {
    "min_replicas": 0,
    "max_replicas": 4,
    "window_s": 30.0,
    "scale_down_delay_s": 120.0,
    "concurrency_target": 16,
    "scale_to_zero_idle_s": 900.0,
    "schedule": [],
}
NEW_AUTOSCALING = {
    "min_replicas": 0,
    "max_replicas": 4,
    "window_seconds": 30.0,
    "scale_down_delay_seconds": 120.0,
    "target_concurrency": 16,
    "scale_to_zero_idle_seconds": 900.0,
    "schedule": [],
}


def _deployment_json(conn) -> tuple[dict, dict]:
    row = conn.execute(text("SELECT autoscaling, placement FROM deployments")).one()
    return row.autoscaling, row.placement


def test_0003_renames_a_deployments_knobs_keeping_their_values_and_back(empty_database_url):
    """A deployment stored before 0003 keeps every value (16, not the new default 8)."""
    upgrade(empty_database_url, "0002")
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO deployments (id, name, generation, model_id, model_revision, "
                    "engine_image, engine_args, gpus_per_replica, gpu_types, autoscaling, "
                    "placement, priority, traffic, revision, demand_replicas, status) VALUES "
                    "('d1', 'chat', 1, 'm', 'main', 'img', '[]', 1, '[\"H100-80G\"]', "
                    "CAST(:auto AS jsonb), CAST(:placement AS jsonb), 100, '{}', 1, 0, '{}')"
                ),
                {
                    "auto": json.dumps(OLD_AUTOSCALING),
                    "placement": json.dumps({"min_providers": 2, "min_regions": 3}),
                },
            )
        upgrade(empty_database_url)
        with engine.connect() as conn:
            autoscaling, placement = _deployment_json(conn)
        assert autoscaling == NEW_AUTOSCALING
        assert placement == {"min_distinct_providers": 2, "min_distinct_regions": 3}

        downgrade(empty_database_url, "0002")
        with engine.connect() as conn:
            autoscaling, placement = _deployment_json(conn)
        assert autoscaling == OLD_AUTOSCALING
        assert placement == {"min_providers": 2, "min_regions": 3}
    finally:
        engine.dispose()
