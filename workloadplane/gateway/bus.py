"""The gateway's side of NATS: watch the routing table, hear every plane's load.

Read only. The table is a JetStream KV key (``ROUTES_BUCKET``/``ROUTES_KEY``) watched with
an ephemeral push consumer that delivers the last value first, re-created after every
reconnect and re-read every ``resync_interval`` (the state keeps only newer tables, so
repeats are harmless). Load reports are core NATS on ``PLANE_LOAD_SUBJECTS``. NATS being
unreachable, at start or later, never raises out of here: the gateway keeps routing from
what it has (static stability).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from controlplane.contracts import (
    PLANE_LOAD_SUBJECTS,
    ROUTES_STREAM,
    ROUTES_SUBJECT,
    NatsCredentials,
)
from workloadplane.gateway.state import GatewayState
from workloadplane.natsconnect import connect_until_up, watch_key

log = logging.getLogger(__name__)

KV_OPERATION = "KV-Operation"


class GatewayBus:
    def __init__(
        self,
        name: str,
        servers: str | list[str],
        credentials: NatsCredentials | None,
        state: GatewayState,
        *,
        resync_interval: float = 10.0,
    ) -> None:
        self.name = name
        self._servers = servers
        self._credentials = credentials
        self.state = state
        self._resync_interval = resync_interval
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._watch: JetStreamContext.PushSubscription | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._connect_loop(), name="gateway-bus")]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def _connect_loop(self) -> None:
        self._nc = await connect_until_up(
            self._servers,
            f"gpufleet-gateway-{self.name}",
            self._credentials,
            why_waiting="routing from the persisted table; retrying",
            callbacks={
                "reconnected_cb": self._on_reconnected,
                "disconnected_cb": self._on_disconnected,
                "error_cb": self._on_error,
            },
        )
        self._js = self._nc.jetstream(timeout=2.0)
        self.state.bus_connected = True
        await self._nc.subscribe(PLANE_LOAD_SUBJECTS, cb=self._on_load)
        await self._subscribe_watch()
        while True:
            await asyncio.sleep(self._resync_interval)
            await self.resync()

    async def _on_reconnected(self) -> None:
        self.state.bus_connected = True
        await self._subscribe_watch()

    async def _on_disconnected(self) -> None:
        self.state.bus_connected = False

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS error: %s", exc)

    async def _on_load(self, msg: Msg) -> None:
        self.state.apply_load(msg.subject, msg.data)

    async def _subscribe_watch(self) -> None:
        if self._js is None:
            return
        old, self._watch = self._watch, None
        try:
            self._watch = await watch_key(
                self._js, old, ROUTES_SUBJECT, ROUTES_STREAM, self._on_watch
            )
        except Exception as exc:  # bucket missing yet: the resync re-tries
            log.warning("cannot watch the routing table yet (%s); will retry", exc)

    async def _on_watch(self, msg: Msg) -> None:
        if msg.headers and msg.headers.get(KV_OPERATION) in ("DEL", "PURGE"):
            log.warning("routing table key deleted; keeping the last table")
            return
        self.state.apply_table(msg.data)

    async def resync(self) -> None:
        if self._nc is None or not self._nc.is_connected:
            return
        if self._watch is None:
            await self._subscribe_watch()
        try:
            raw = await self._nc.jsm(timeout=2.0).get_msg(
                ROUTES_STREAM, subject=ROUTES_SUBJECT, direct=True
            )
        except NotFoundError:
            return
        except Exception as exc:
            log.debug("routing table resync failed: %s", exc)
            return
        if raw.data and not (raw.headers and raw.headers.get(KV_OPERATION)):
            self.state.apply_table(raw.data, stored=True)
