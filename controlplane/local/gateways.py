"""The local fleet's two global gateways: names, regions, ports, NATS users.

Each gateway has its own read-only NATS user (``gateway_user(name)``, its password in
DATA_DIR/secrets/): it may watch the routing table's key and hear the planes' load reports,
nothing else (``controlplane.bus.credentials.gateway_permissions``; `up` renders them with
``render_server_config(gateways=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.settings import Settings


@dataclass(frozen=True)
class DemoGateway:
    name: str
    region: str


GATEWAYS = (DemoGateway("use1", "aws-us-east-1"), DemoGateway("euc1", "aws-eu-central-1"))
"""Two gateways in two demo regions (the fleet's regions: infra/examples/fleet.yaml)."""


def gateway_base_port(settings: Settings) -> int:
    """Gateway i listens on this + i (``GPUFLEET_GATEWAY_BASE_PORT``, else routers' + 10)."""
    if settings.gateway_base_port is not None:
        return settings.gateway_base_port
    return settings.router_base_port + 10


@dataclass(frozen=True)
class MetricsPorts:
    """Where `up`'s processes without an HTTP port of their own serve ``/metrics``."""

    bus: int
    worker: int
    first_agent: int

    def agent(self, i: int) -> int:
        return self.first_agent + i


def metrics_ports(settings: Settings) -> MetricsPorts | None:
    """From ``GPUFLEET_METRICS_BASE_PORT`` (else the routers' base + 20); None when it is 0."""
    base = settings.metrics_base_port
    if base is None:
        base = settings.router_base_port + 20
    if base == 0:
        return None
    return MetricsPorts(bus=base, worker=base + 1, first_agent=base + 10)
