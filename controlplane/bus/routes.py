"""Publish the gateways' routing table into its KV bucket (one key: ``ROUTES_KEY``).

The same rules as desired state (`controlplane.bus.desired`): the write is a compare-and-set
on the key's revision and a table whose ``(epoch, generation)`` is not above the stored one
is refused (``stale``), so a slow or restarted publisher never overwrites a newer table.
A refusal hands back the stored table: the caller checks it against its own numbering
(`controlplane.services.routes.claim_stored`). A table bigger than the bucket's
``MAX_ROUTES_BYTES`` (or the server's max_payload) is never sent: `RoutesTooLarge`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from prometheus_client import Counter, Gauge

from controlplane.bus.desired import HEADER_ROOM, MAX_CAS_ATTEMPTS
from controlplane.contracts import (
    MAX_ROUTES_BYTES,
    ROUTES_KEY,
    RejectedMessageError,
    RoutingTable,
    decode_routing_table,
)

log = logging.getLogger(__name__)

PUBLISHED = Counter(
    "gpufleet_bus_routes_published_total", "Routing tables written to the routes bucket"
)
TOO_LARGE = Counter(
    "gpufleet_bus_routes_too_large_total",
    "Routing tables not sent because they exceed MAX_ROUTES_BYTES or the server's max_payload",
)
GENERATION = Gauge(
    "gpufleet_bus_routes_generation", "Generation of the routing table last written or found"
)


class RoutesTooLarge(Exception):
    """The encoded table does not fit in the bucket; nothing was written."""

    def __init__(self, table: RoutingTable, size: int, limit: int) -> None:
        self.table, self.size, self.limit = table, size, limit
        super().__init__(
            f"routing table generation {table.generation} is {size} bytes, above the "
            f"{limit}-byte limit; the gateways keep the previous table"
        )


@dataclass(frozen=True)
class RoutesResult:
    """``published``: written; ``stale``: the stored version is already >= ours
    (``stored`` is that table; None when it could not be read)."""

    outcome: Literal["published", "stale"]
    kv_revision: int
    stored: RoutingTable | None = None


def encode_table(table: RoutingTable) -> bytes:
    return table.model_dump_json().encode()


async def current_routes(kv: KeyValue) -> tuple[RoutingTable | None, int]:
    """The stored table and its KV revision (0: no key). An unreadable value is None."""
    try:
        entry = await kv.get(ROUTES_KEY)
    except KeyNotFoundError:
        return None, 0
    if entry.value is None:
        return None, entry.revision or 0
    try:
        return decode_routing_table(entry.value), entry.revision or 0
    except RejectedMessageError as exc:
        log.warning("the stored routing table is unreadable (%s); overwriting it", exc)
        return None, entry.revision or 0


class RoutesPublisher:
    """Writes tables in version order; remembers the revision it wrote, so the common case
    is one compare-and-set."""

    def __init__(self, kv: KeyValue, max_payload: int | None = None) -> None:
        self._kv = kv
        self._limit = MAX_ROUTES_BYTES
        if max_payload is not None:
            self._limit = min(self._limit, max_payload - HEADER_ROOM)
        self._last: tuple[tuple[int, int], int] | None = None

    def forget(self) -> None:
        """The revision written is gone (the bucket was made again): compare afresh."""
        self._last = None

    async def publish(self, table: RoutingTable) -> RoutesResult:
        payload = encode_table(table)
        if len(payload) > self._limit:
            TOO_LARGE.inc()
            raise RoutesTooLarge(table, len(payload), self._limit)
        if self._last is not None and self._last[0] < table.version:
            try:
                revision = await self._kv.update(ROUTES_KEY, payload, last=self._last[1])
            except KeyWrongLastSequenceError:
                pass  # someone else wrote: compare against what is stored now
            else:
                return self._wrote(table, revision)
        for _ in range(MAX_CAS_ATTEMPTS):
            stored, revision = await current_routes(self._kv)
            if stored is not None and stored.version >= table.version:
                self._last = (stored.version, revision)
                GENERATION.set(stored.generation)
                return RoutesResult("stale", revision, stored)
            try:
                if revision == 0:
                    new_revision = await self._kv.create(ROUTES_KEY, payload)
                else:
                    new_revision = await self._kv.update(ROUTES_KEY, payload, last=revision)
            except KeyWrongLastSequenceError:
                continue
            return self._wrote(table, new_revision)
        raise RuntimeError(
            f"could not publish the routing table: {MAX_CAS_ATTEMPTS} concurrent-write "
            "conflicts in a row; is another control plane publishing?"
        )

    def _wrote(self, table: RoutingTable, revision: int) -> RoutesResult:
        self._last = (table.version, revision)
        PUBLISHED.inc()
        GENERATION.set(table.generation)
        return RoutesResult("published", revision)
