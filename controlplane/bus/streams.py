"""Create (idempotently) the JetStream objects the bus needs."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.kv import KeyValue

from controlplane.contracts import (
    DESIRED_BUCKET,
    MAX_ROUTES_BYTES,
    REPORTS_STREAM,
    REPORTS_SUBJECTS,
    ROUTES_BUCKET,
)

REPORTS_MAX_AGE_S = 7 * 24 * 3600.0
"""Reports older than this are dropped even if unconsumed (a week of control-plane outage)."""
DUPLICATE_WINDOW_S = 120.0


async def ensure_desired_bucket(js: JetStreamContext) -> KeyValue:
    """The desired-state KV bucket (one key per cluster, a little history for debugging)."""
    return await js.create_key_value(
        config=KeyValueConfig(
            bucket=DESIRED_BUCKET,
            history=5,
            storage=StorageType.FILE,
            direct=True,
            description="gpufleet desired state, one snapshot per cluster",
        )
    )


async def ensure_routes_bucket(js: JetStreamContext) -> KeyValue:
    """The gateways' routing-table KV bucket: one key (``ROUTES_KEY``), a little history."""
    return await js.create_key_value(
        config=KeyValueConfig(
            bucket=ROUTES_BUCKET,
            history=3,
            storage=StorageType.FILE,
            direct=True,
            max_value_size=MAX_ROUTES_BYTES,
            description="gpufleet routing table for the gateways, one snapshot",
        )
    )


async def ensure_reports_stream(js: JetStreamContext) -> None:
    """The stream of observed state and facts from every cluster."""
    await js.add_stream(
        StreamConfig(
            name=REPORTS_STREAM,
            subjects=list(REPORTS_SUBJECTS),
            storage=StorageType.FILE,
            max_age=REPORTS_MAX_AGE_S,
            duplicate_window=DUPLICATE_WINDOW_S,
            description="gpufleet observed state and facts from workload planes",
        )
    )


async def ensure_bus(js: JetStreamContext) -> KeyValue:
    """Everything at once; safe to call on every control-plane start."""
    await ensure_reports_stream(js)
    await ensure_routes_bucket(js)
    return await ensure_desired_bucket(js)
