"""Settings for every control-plane process, read from `GPUFLEET_*` environment variables.

A URL left empty means "start the embedded server" (PostgreSQL, NATS, Redis) under `data_dir`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", env_file=".env", extra="ignore")

    database_url: str = Field(
        default="",
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host:5432/gpufleet. "
        "Empty: `gpufleet up` starts an embedded PostgreSQL.",
    )
    nats_url: str = Field(default="", description="Empty: `gpufleet up` starts nats-server.")
    redis_url: str = Field(default="", description="Empty: `gpufleet up` starts redis-server.")
    data_dir: Path = Field(default=Path(".gpufleet"), description="State of the local fleet.")
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_workers: int = Field(
        default=4, ge=1, description="uvicorn worker processes (reads wait on PostgreSQL)"
    )
    postgres_port: int = 5433
    router_base_port: int = Field(
        default=8100,
        description="`up` serves demo cluster i's OpenAI-compatible router on base + i",
    )
    nats_port: int = 4223
    bus_metrics_port: int | None = Field(
        default=None, description="The bus process serves /metrics on this port (none: off)."
    )
    redis_port: int = 6380
    db_pool_size: int = 10
    page_size_max: int = 500
    api_max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest request body the API reads (bytes); a larger one gets 413. "
        "Field limits (docs/api.md) keep every valid object far below it.",
    )
    cluster_stale_after_s: float = 15.0
    cluster_down_after_s: float = 60.0
    bus_progress_every_s: float = Field(
        default=2.0,
        gt=0,
        description="the bus process records how far it has processed the reports stream "
        "this often; liveness counts silence only up to that point",
    )
    liveness_breaker_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="when at least this share of the clusters (and at least "
        "`liveness_breaker_min_clusters`) would go down in one check, none is declared down",
    )
    liveness_breaker_min_clusters: int = Field(default=2, ge=1)
    report_demand_factor: float = Field(
        default=2.0,
        gt=0,
        description="a plane's reported demand for a deployment counts up to this many times "
        "the deployment's max_replicas (and up to `report_demand_max`)",
    )
    report_demand_max: int = Field(default=1000, ge=1)
    report_in_flight_max: int = Field(default=100_000, ge=1)
    report_queue_depth_max: int = Field(default=100_000, ge=1)
    spend_guard_window_s: float = Field(
        default=3600.0, gt=0, description="the spend guard's sliding window"
    )
    spend_guard_gpus_per_deployment: int = Field(
        default=64,
        ge=0,
        description="GPUs reported demand may add to one deployment per window",
    )
    spend_guard_cost_per_deployment: float = Field(
        default=250.0, ge=0, description="$/h reported demand may add to one deployment per window"
    )
    spend_guard_fleet_cost: float = Field(
        default=1000.0, ge=0, description="$/h reported demand may add fleet-wide per window"
    )

    load_demo_fleet: bool = True
    agent_metrics_base_port: int = Field(
        default=0,
        ge=0,
        description="`up` serves demo cluster i's agent metrics on 127.0.0.1:base + i/metrics "
        "(0: not served; the routers' /metrics serve the data path's)",
    )
    up_status_every_s: float = Field(
        default=15.0,
        gt=0,
        description="`up` prints its status line and refreshes the NATS users this often",
    )


@lru_cache
def get_settings() -> Settings:
    return Settings()
