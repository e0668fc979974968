"""The gateway's composition root: state (with the persisted table), bus, prober and the
HTTP app built and handed to each other; ``run_gateway`` serves until SIGTERM/SIGINT.

Start order is what makes static stability work: the persisted routing table is loaded
first and the HTTP server starts at once, before NATS is reached; the bus then follows the
table and the load reports in the background and never blocks serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from controlplane.contracts import NatsCredentials
from workloadplane.gateway.app import GatewayApp, GatewayConfig
from workloadplane.gateway.bus import GatewayBus
from workloadplane.gateway.choice import ChoiceParams
from workloadplane.gateway.prober import PlaneProber
from workloadplane.gateway.state import GatewayState, RoutesStore
from workloadplane.router.httpserver import HttpServer, Limits
from workloadplane.router.server import run_fast, stop_on_signals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewaySettings:
    name: str
    region: str
    host: str
    port: int
    state_dir: Path
    nats_url: str
    credentials: NatsCredentials | None
    probe_interval_s: float = 0.25
    probe_timeout_s: float = 0.5
    measured_rtt: bool = True


async def serve_gateway(
    settings: GatewaySettings,
    config: GatewayConfig,
    stop: asyncio.Event,
    params: ChoiceParams | None = None,
) -> None:
    state = GatewayState(
        settings.region,
        time.monotonic,
        RoutesStore(settings.state_dir),
        params or ChoiceParams(measured_rtt=settings.measured_rtt),
    )
    state.restore()
    limits = Limits(
        max_body_bytes=config.max_body_bytes,
        max_headers=config.max_headers,
        max_header_bytes=config.max_header_bytes,
        server="gateway",
    )
    app = GatewayApp(state, config)
    server = HttpServer(app, limits=limits, fast=app.fast)
    prober = PlaneProber(
        state, interval_s=settings.probe_interval_s, timeout_s=settings.probe_timeout_s
    )
    bus = GatewayBus(settings.name, settings.nats_url, settings.credentials, state)
    await server.start(settings.host, settings.port)
    prober.start()
    await bus.start()
    log.info(
        "gateway %s (%s) serving on %s:%s",
        settings.name,
        settings.region,
        settings.host,
        settings.port,
    )
    try:
        await stop.wait()
    finally:
        await server.close()
        await prober.close()
        await bus.close()
        state.close()


def run_gateway(settings: GatewaySettings, config: GatewayConfig) -> None:
    async def run() -> None:
        await serve_gateway(settings, config, stop_on_signals())

    run_fast(run())
