"""Settings for every control-plane process, read from `GPUFLEET_*` environment variables.

A URL left empty means "start the embedded server" (PostgreSQL, NATS, Redis) under `data_dir`.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewayEndpoint(BaseModel):
    """Where a global gateway answers and the region it stands in (for the dashboard's map)."""

    url: str
    region: str


METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})


def check_webhook_url(url: str) -> None:
    """Raise ValueError naming what to change when ``url`` is no receiver to send events to:
    not http(s), no host, or a cloud metadata address (the worker's own credentials live
    there: an export pointed at it would be a way in)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018  (a bad port raises ValueError here)
    except ValueError:
        raise ValueError("is not a URL: give one like https://alerts.example/hook") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("must be an http(s) URL with a host, like https://alerts.example/hook")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    if host in METADATA_HOSTS or (address is not None and address.is_link_local):
        raise ValueError(f"{host} is a cloud metadata or link-local address; not a receiver")


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
    router_urls: dict[str, str] = Field(
        default_factory=dict,
        description="cluster name → its router's base URL, for the dashboard's playground when "
        "the cluster has no `endpoint` (JSON; `gpufleet up` sets it for the demo clusters)",
    )
    gateway_base_port: int | None = Field(
        default=None,
        description="`up` serves demo gateway i on base + i (none: the routers' base + 10)",
    )
    gateway_urls: dict[str, GatewayEndpoint] = Field(
        default_factory=dict,
        description="gateway name → {url, region}, for the dashboard's map of where traffic "
        "goes (JSON; `gpufleet up` sets it for the demo gateways)",
    )
    nats_port: int = 4223
    bus_metrics_port: int | None = Field(
        default=None, description="The bus process serves /metrics on this port (none: off)."
    )
    redis_port: int = 6380
    db_pool_size: int = 10
    db_lock_timeout_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Longest a database statement waits for a lock before it fails (the API "
        "answers 503 with Retry-After, a task retries); 0: no limit",
    )
    db_idle_in_transaction_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="PostgreSQL ends a session idle inside a transaction this long, releasing "
        "its locks (a frozen or stuck process); 0: no limit",
    )
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
    report_tokens_per_s_max: int = Field(
        default=10_000_000,
        ge=1,
        description="the most tokens per second a plane's router may report for one "
        "deployment since its last recorded report (more is counted as this)",
    )
    report_bytes_per_s_max: int = Field(default=2_000_000_000, ge=1)
    report_facts_per_s: float = Field(
        default=50.0,
        gt=0,
        le=1e6,
        description="facts one cluster may send per second, sustained; past it (and the "
        "burst) a fact is dropped and counted (`fact_rate`)",
    )
    report_facts_burst: float = Field(
        default=5000.0, ge=1, le=1e9, description="facts one cluster may send at once"
    )
    report_heartbeats_per_s: float = Field(
        default=10.0,
        gt=0,
        le=1e6,
        description="heartbeats of one cluster recorded per second, sustained; past it (and "
        "the burst) one is dropped and counted (`heartbeat_rate`): a newer one follows",
    )
    report_heartbeats_burst: float = Field(
        default=100.0, ge=1, le=1e9, description="heartbeats of one cluster recorded at once"
    )
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
    cost_accrue_every_s: float = Field(
        default=60.0, gt=0, description="the worker adds to the cost ledger this often"
    )
    cost_accrual_max_gap_s: float = Field(
        default=3600.0,
        gt=0,
        description="an accrual after a longer silence (the worker was down) charges only its "
        "last this many seconds, at the fleet as it stands, and logs what it left out",
    )
    cost_ledger_retention_days: int = Field(
        default=400, ge=1, description="cost ledger and token usage rows older than this go"
    )
    events_retention_days: int = Field(
        default=90,
        ge=1,
        le=36500,
        description="events recorded longer ago than this go (also any the webhook export "
        "has not sent by then)",
    )
    cost_window_max_days: int = Field(
        default=400, ge=1, description="the longest window `GET /costs` answers for"
    )
    cost_egress_dollars_per_gb: float = Field(
        default=0.0,
        ge=0,
        description="TCO: data transfer, per GB the planes' routers served (0: not counted)",
    )
    cost_storage_dollars_per_month: float = Field(
        default=0.0, ge=0, description="TCO: storage (weights, images, logs) per month"
    )
    cost_engineering_dollars_per_month: float = Field(
        default=0.0, ge=0, description="TCO: the engineering line (people, support) per month"
    )

    load_demo_fleet: bool = True
    metrics_base_port: int | None = Field(
        default=None,
        ge=0,
        description="`up` serves the bus process's /metrics on base, the Celery worker's on "
        "base + 1 and demo cluster i's agent's on base + 10 + i (none: the routers' base + 20; "
        "0: none of them)",
    )
    worker_metrics_port: int | None = Field(
        default=None,
        description="The Celery worker serves /metrics on this port (none: off; `up` sets it)",
    )
    up_status_every_s: float = Field(
        default=15.0,
        gt=0,
        description="`up` prints its status line and refreshes the NATS users this often",
    )

    # The export of events and audit entries to a webhook (docs/logging.md)
    events_webhook_url: str = Field(
        default="",
        description="POST new events and audit entries here as Alertmanager webhook payloads "
        "(empty: no export)",
    )
    events_webhook_token: SecretStr | None = Field(
        default=None, description="Sent as 'Authorization: Bearer …'; never logged"
    )
    events_webhook_every_s: float = Field(
        default=5.0, gt=0, description="How often the worker sends what is new"
    )
    events_webhook_max_alerts: int = Field(
        default=100, ge=1, le=10_000, description="Alerts in one payload at most"
    )
    events_webhook_max_bytes: int = Field(
        default=256 * 1024, ge=16 * 1024, description="Bytes of one payload at most"
    )
    events_webhook_timeout_s: float = Field(default=10.0, gt=0)
    events_webhook_max_rejections: int = Field(
        default=5,
        ge=1,
        description="A batch the receiver refuses (a 4xx about the payload: 400, 413, 422…; "
        "not 401/403/404/408/429 nor a redirect, which wait for the receiver) this many times "
        "in a row is dead-lettered: skipped, counted, its row ids logged",
    )

    @field_validator("events_webhook_url")
    @classmethod
    def _a_receiver_url(cls, v: str) -> str:
        if v:
            check_webhook_url(v)
        return v

    @model_validator(mode="after")
    def _gap_covers_the_period(self) -> Settings:
        """A gap shorter than two accrual periods drops part of every tick (30 s of each
        60): the ledger would charge half of what the fleet costs."""
        if self.cost_accrual_max_gap_s < 2 * self.cost_accrue_every_s:
            raise ValueError(
                f"GPUFLEET_COST_ACCRUAL_MAX_GAP_S ({self.cost_accrual_max_gap_s:g}) must be at "
                f"least twice GPUFLEET_COST_ACCRUE_EVERY_S ({self.cost_accrue_every_s:g})"
            )
        return self


class SettingsError(SystemExit):
    """Settings that do not validate: says which variable and why, never its value (a URL
    there may carry a password). A SystemExit: the process stops with this line, no
    traceback (pydantic's own error prints every input value)."""


def load_settings(**overrides: Any) -> Settings:
    """``Settings`` from the environment (and ``.env``) with ``overrides``; SettingsError
    when they do not validate."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_input=False, include_url=False):
            field = str(error["loc"][0]) if error["loc"] else ""
            name = f"GPUFLEET_{field.upper()}" if field else "the settings"
            lines.append(f"{name}: {error['msg']}")
        raise SettingsError("gpufleet cannot start: " + "; ".join(lines)) from None


@lru_cache
def get_settings() -> Settings:
    return load_settings()


def db_timeouts(settings: Settings) -> dict[str, float]:
    """``make_engine``'s lock and idle-in-transaction bounds from the settings."""
    return {
        "lock_timeout_s": settings.db_lock_timeout_s,
        "idle_in_transaction_s": settings.db_idle_in_transaction_s,
    }
