"""Create (idempotently) the JetStream objects the bus needs."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import BadRequestError
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
REPORTS_MAX_BYTES = 1024**3
"""The stream's disk: a plane publishing in a loop (its own subjects are all it may use) pushes
out the oldest reports instead of filling the control plane's disk; planes report their whole
state again at every heartbeat, so what is lost is history, not state."""
REPORTS_PER_SUBJECT = 1000
"""Reports the stream keeps per subject (one cluster's heartbeats, or its facts of one
type): a plane publishing in a loop pushes out its own oldest reports, not other planes'
(past the stream's bytes, the oldest of all go)."""
DUPLICATE_WINDOW_S = 120.0
STREAM_NAME_IN_USE = 10058  # JetStream: a stream of that name exists with another config


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
    """The stream of observed state and facts from every cluster, bounded on disk; one made
    before its limits were set gets them."""
    config = StreamConfig(
        name=REPORTS_STREAM,
        subjects=list(REPORTS_SUBJECTS),
        storage=StorageType.FILE,
        max_age=REPORTS_MAX_AGE_S,
        max_bytes=REPORTS_MAX_BYTES,
        max_msgs_per_subject=REPORTS_PER_SUBJECT,
        discard=DiscardPolicy.OLD,
        duplicate_window=DUPLICATE_WINDOW_S,
        description="gpufleet observed state and facts from workload planes",
    )
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != STREAM_NAME_IN_USE:
            raise
        await js.update_stream(config)


async def ensure_bus(js: JetStreamContext) -> KeyValue:
    """Everything at once; safe to call on every control-plane start."""
    await ensure_reports_stream(js)
    await ensure_routes_bucket(js)
    return await ensure_desired_bucket(js)
