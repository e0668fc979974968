"""Publish a cluster's DesiredState snapshot into the KV bucket.

Versions — ``(epoch, generation)`` — only move forward: the write is a compare-and-set on
the key's KV revision, and a snapshot whose version is not above the stored one is refused,
so a slow or restarted publisher can never overwrite a newer snapshot. A refusal says
whether the stored version is *ahead* of ours (``PublishResult.ahead``): the caller then
checks it against the cluster's numbering and starts a new epoch if the control plane never
issued it (``controlplane.services.epochs``).

A snapshot bigger than the server's `max_payload` is never sent (NATS would refuse it and
close the connection): `DesiredPublisher.publish` raises `DesiredStateTooLarge` before any
write, so one oversized cluster cannot stop the others. A deleted cluster's key is retired
with an empty snapshot one generation above the stored one, so that its agent stops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue
from prometheus_client import Counter

from controlplane.contracts import DesiredState, decode_desired, desired_key, encode

log = logging.getLogger(__name__)

MAX_CAS_ATTEMPTS = 10
HEADER_ROOM = 512
"""Bytes of `max_payload` left for the KV write's headers (expected-sequence and the like)."""

TOO_LARGE = Counter(
    "gpufleet_bus_desired_too_large_total",
    "Desired-state snapshots not sent because they exceed the NATS server's max_payload",
    ["cluster"],
)


class DesiredStateTooLarge(Exception):
    """The encoded snapshot does not fit in one NATS message; nothing was written."""

    def __init__(self, state: DesiredState, size: int, limit: int) -> None:
        self.state, self.size, self.limit = state, size, limit
        super().__init__(
            f"desired state of {state.cluster} at generation {state.generation} is {size} "
            f"bytes; the NATS server's max_payload is {limit} bytes ({HEADER_ROOM} of them "
            "kept for headers)"
        )

    def biggest(self, n: int = 3) -> list[tuple[str, int]]:
        """The deployments that weigh most in the snapshot: (name, encoded bytes)."""
        sizes = [(d.name, len(d.model_dump_json())) for d in self.state.deployments]
        return sorted(sizes, key=lambda s: (-s[1], s[0]))[:n]


@dataclass(frozen=True)
class PublishResult:
    """``published``: written; ``stale``: the stored version is already >= ours.
    ``stored_generation``/``stored_epoch``: what the key holds now."""

    outcome: Literal["published", "stale"]
    stored_generation: int
    kv_revision: int
    stored_epoch: int = 0

    @property
    def stored_version(self) -> tuple[int, int]:
        return (self.stored_epoch, self.stored_generation)

    def ahead(self, state: DesiredState) -> bool:
        """True when the key holds a version above ``state``'s (not merely the same one)."""
        return self.outcome == "stale" and self.stored_version > state.version


async def current_desired(kv: KeyValue, cluster: str) -> tuple[DesiredState | None, int]:
    """The stored snapshot and its KV revision (0 if the key does not exist)."""
    try:
        entry = await kv.get(desired_key(cluster))
    except KeyNotFoundError:
        return None, 0
    if entry.value is None:
        return None, entry.revision or 0
    return decode_desired(entry.value), entry.revision or 0


async def publish_desired(kv: KeyValue, state: DesiredState) -> PublishResult:
    """Store ``state`` as its cluster's snapshot unless a newer-or-equal generation is there.

    Re-publishing the same generation is a no-op (``stale``), which makes "re-publish every
    snapshot on start" harmless.
    """
    key = desired_key(state.cluster)
    payload = encode(state)
    for _ in range(MAX_CAS_ATTEMPTS):
        try:
            stored, revision = await current_desired(kv, state.cluster)
        except ValueError:
            # An unreadable stored value must not block the newest snapshot forever.
            log.warning("desired state for %s unreadable; overwriting", state.cluster)
            stored, revision = None, (await kv.get(key)).revision or 0
        if stored is not None and stored.version >= state.version:
            return PublishResult("stale", stored.generation, revision, stored.epoch)
        try:
            if revision == 0:
                new_revision = await kv.create(key, payload)
            else:
                new_revision = await kv.update(key, payload, last=revision)
        except KeyWrongLastSequenceError:
            continue  # someone wrote in between: re-read and compare again
        return PublishResult("published", state.generation, new_revision, state.epoch)
    raise RuntimeError(
        f"could not publish desired state for {state.cluster}: {MAX_CAS_ATTEMPTS} "
        "concurrent-write conflicts in a row; is another control plane publishing?"
    )


async def retire_desired(kv: KeyValue, cluster: str) -> PublishResult | None:
    """A deleted cluster: store an empty snapshot one generation above the stored one, so
    that its agent stops every replica. None when there is nothing to retire (no key, or
    the stored snapshot is already empty), so retiring again is harmless."""
    stored, _ = await current_desired(kv, cluster)
    if stored is None or (not stored.deployments and not stored.instances):
        return None
    empty = DesiredState(cluster=cluster, generation=stored.generation + 1, epoch=stored.epoch)
    return await publish_desired(kv, empty)


async def stored_clusters(kv: KeyValue) -> set[str]:
    """The clusters that have a desired-state key in the bucket."""
    try:
        return set(await kv.keys())
    except NoKeysError:
        return set()


class DesiredPublisher:
    """`publish_desired` with the last written revision remembered per cluster.

    The common case — we wrote the previous snapshot ourselves — is then one round trip:
    a compare-and-set against the revision we wrote. If anyone else wrote in between the
    CAS fails and we fall back to read-compare-write, so the guarantee is unchanged.
    `max_payload` (the server's, from the connection's INFO) bounds what is sent.
    """

    def __init__(self, kv: KeyValue, max_payload: int | None = None) -> None:
        self._kv = kv
        self._max_payload = max_payload
        # cluster -> ((epoch, generation), kv revision) of the last snapshot we wrote or saw
        self._last: dict[str, tuple[tuple[int, int], int]] = {}

    def forget(self) -> None:
        """The revisions written are gone (the bucket was made again): compare afresh."""
        self._last.clear()

    async def publish(self, state: DesiredState) -> PublishResult:
        """Raises `DesiredStateTooLarge` (writing nothing) if the snapshot cannot be sent."""
        payload = encode(state)
        size = len(payload)
        if self._max_payload is not None and size + HEADER_ROOM > self._max_payload:
            TOO_LARGE.labels(cluster=state.cluster).inc()
            raise DesiredStateTooLarge(state, size, self._max_payload)
        known = self._last.get(state.cluster)
        if known is not None and known[0] < state.version:
            try:
                revision = await self._kv.update(desired_key(state.cluster), payload, last=known[1])
            except KeyWrongLastSequenceError:
                pass  # someone else wrote: compare against what is stored now
            else:
                self._last[state.cluster] = (state.version, revision)
                return PublishResult("published", state.generation, revision, state.epoch)
        result = await publish_desired(self._kv, state)
        self._last[state.cluster] = (result.stored_version, result.kv_revision)
        return result
