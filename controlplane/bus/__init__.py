"""The control plane's side of the NATS bus: desired state and the routing table out, observed state and facts in."""

from controlplane.bus.consumer import (
    DURABLE_NAME,
    InMemorySink,
    ObservedStateSink,
    ReportConsumer,
)
from controlplane.bus.credentials import (
    NatsCredentials,
    cluster_permissions,
    gateway_permissions,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    generate_gateway_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.bus.desired import PublishResult, current_desired, publish_desired
from controlplane.bus.streams import (
    ensure_bus,
    ensure_desired_bucket,
    ensure_reports_stream,
    ensure_routes_bucket,
)

__all__ = [
    "DURABLE_NAME",
    "InMemorySink",
    "NatsCredentials",
    "ObservedStateSink",
    "PublishResult",
    "ReportConsumer",
    "cluster_permissions",
    "current_desired",
    "ensure_bus",
    "ensure_desired_bucket",
    "ensure_reports_stream",
    "ensure_routes_bucket",
    "gateway_permissions",
    "generate_cluster_credentials",
    "generate_controlplane_credentials",
    "generate_gateway_credentials",
    "publish_desired",
    "render_server_config",
    "write_server_config",
]
