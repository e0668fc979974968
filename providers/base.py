"""The provider protocol: plain-data offers and instances, typed errors callers branch on.

Every adapter (aws, gcp, lambda_cloud, local) implements `Provider`; the contract lives in
the docstrings below and is checked by `tests/integration/providers/test_contract.py`.
Adapters are synchronous (procurement runs them in Celery workers) and never retry on
their own: procurement owns retries, backoff and fallbacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable


class PurchaseType(StrEnum):
    RESERVED = "reserved"
    ON_DEMAND = "on_demand"
    SPOT = "spot"


class InstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    """Stopped by the provider (GCE's TERMINATED after a host event): it exists and its
    disks bill, it serves nothing; procurement marks its row gone and deletes it."""
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PoolRef:
    """Where and how to buy: one GPU type, one shape, one region (and zone), one purchase type.

    `capacity_reservation_id` is required for `reserved` pools and forbidden otherwise.
    `zone` may be None where the provider places instances by region only (lambda, local).
    """

    name: str
    region: str
    zone: str | None
    gpu_type: str
    instance_type: str
    purchase_type: PurchaseType
    gpus_per_instance: int
    capacity_reservation_id: str | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_instance < 1:
            raise InvalidRequest(
                f"pool {self.name!r}: gpus_per_instance is {self.gpus_per_instance}; "
                "set it to the number of GPUs one instance has (1 or more)"
            )
        reserved = self.purchase_type is PurchaseType.RESERVED
        if reserved and not self.capacity_reservation_id:
            raise InvalidRequest(
                f"pool {self.name!r} is reserved but has no capacity_reservation_id; "
                "set the provider's reservation id or change purchase_type"
            )
        if not reserved and self.capacity_reservation_id:
            raise InvalidRequest(
                f"pool {self.name!r} is {self.purchase_type} but names capacity reservation "
                f"{self.capacity_reservation_id!r}; drop it or make the pool reserved"
            )


@dataclass(frozen=True, slots=True)
class Offer:
    """What can be bought, at what price, as the provider reports it now (plain data).

    Prices are USD per instance-hour; None when the provider's API does not say (then the
    adapter's configured price table is used, if any). `available` is the provider's own
    best-effort signal: True never guarantees that `create_instances` succeeds.
    """

    provider: str
    gpu_type: str
    gpus_per_instance: int
    gpu_memory_mib: int
    instance_type: str
    region: str
    zone: str | None
    on_demand_price: float | None
    spot_price: float | None
    available: bool


@dataclass(frozen=True, slots=True)
class Instance:
    """A machine we hold. `pool` is None where the provider cannot record it (lambda):
    callers then map instances to pools by `idempotency_key`."""

    id: str
    pool: str | None
    idempotency_key: str | None
    instance_type: str
    region: str
    zone: str | None
    purchase_type: PurchaseType | None
    gpus: int
    state: InstanceState
    address: str | None = None


@dataclass(frozen=True, slots=True)
class InterruptionNotice:
    """The provider will take `instance_id` back at `deadline` (UTC)."""

    instance_id: str
    deadline: datetime
    reason: str


class ProviderError(Exception):
    """Base of every error an adapter raises; the message says what to change."""

    retryable: bool = False


class InsufficientCapacity(ProviderError):
    """The provider has no capacity for this shape here now: try another zone, region or
    purchase type, or retry later."""

    retryable = True


class QuotaExceeded(ProviderError):
    """An account limit stops the request: do not retry in a loop, raise the quota."""


class Throttled(ProviderError):
    """The API rate limit was hit: back off and retry."""

    retryable = True


class Unavailable(ProviderError):
    """The provider did not answer, or failed on its side (a timeout, a broken connection,
    a 5xx): the call may or may not have been carried out. Retry it as it was (an acquire
    with the same idempotency key); it says nothing about the pool's capacity."""

    retryable = True


class NotFound(ProviderError):
    """The named object does not exist (or no longer exists)."""


class InvalidRequest(ProviderError):
    """The request cannot succeed as written (bad shape, unknown type, mismatched key)."""


_KEY = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


def check_idempotency_key(key: str) -> str:
    """Keys must be portable to every provider's naming rules (GCE labels and names, EC2
    client tokens, Lambda instance names): 1-40 chars of a-z, 0-9 and '-'. A uuid4 fits."""
    if not _KEY.match(key):
        raise InvalidRequest(
            f"idempotency key {key!r} is not 1-40 characters of a-z, 0-9 and '-' starting "
            "with a letter or digit; use str(uuid.uuid4())"
        )
    return key


def check_count(count: int) -> int:
    if count < 1:
        raise InvalidRequest(f"count is {count}; ask for 1 or more instances")
    return count


@runtime_checkable
class Provider(Protocol):
    """One cloud account. Methods are blocking and safe to call from several threads.

    Errors: every failure is a `ProviderError` subclass; nothing else escapes, except
    programming errors.
    """

    kind: str

    def offers(self) -> list[Offer]:
        """GPU shapes this account can buy, per region/zone, with prices and availability.

        Read-only and cheap enough to call every few minutes; never creates anything.
        """
        ...

    def create_instances(self, pool: PoolRef, count: int, idempotency_key: str) -> list[Instance]:
        """Launch `count` instances in `pool` and return them (state pending or running).

        Idempotent: calling again with the same key (and the same pool and count) returns
        the same instances and never launches more, also after a crash mid-call. Reusing a
        key with a different pool or count raises `InvalidRequest` or returns the first
        call's instances; never launches extra. On error, some instances of the key may
        exist (see `list_instances`); retrying with the same key completes the set.
        Raises `InsufficientCapacity`, `QuotaExceeded`, `Throttled`, `InvalidRequest`.
        """
        ...

    def delete_instance(self, instance_id: str) -> None:
        """Release an instance. Silent if it is already gone or going. Returns once the
        provider has accepted the deletion; the instance then no longer appears in
        `list_instances`."""
        ...

    def list_instances(self) -> list[Instance]:
        """Instances that gpufleet launched in this account and that are not being
        deleted or gone. Instances not launched by gpufleet are never returned."""
        ...

    def interruption_notices(self) -> list[InterruptionNotice]:
        """Notices that the provider will take instances back (spot), for instances that
        still exist. A notice may be returned more than once: callers dedupe by
        `instance_id`. Providers without interruptions return []."""
        ...
