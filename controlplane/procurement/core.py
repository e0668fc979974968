"""Procurement decisions, from plain data to plans: no I/O, the clock passed in.

- `decide`: per pool, the instances to acquire and release so that what a pool holds
  carries what the placement uses there (quotas, idle clocks, blocked pools).
- `repair`: per provider, where our instance rows and the provider's own list disagree,
  and what to do about each (adopt, resume, mark gone, release again, delete an orphan).
- `on_failure`: what a provider error means (retry with backoff, or block the pool for a
  while) and which re-plan it asks for.

Invariants: reserved instances are never released for idleness; a blocked pool gets no new
instances; a pool never holds more than its quota (reserved: its commitment); an
instance's idempotency key depends only on its acquire request.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

from providers.base import Instance as ProviderInstance
from providers.base import (
    InstanceState,
    InsufficientCapacity,
    ProviderError,
    QuotaExceeded,
    Throttled,
    Unavailable,
)

ACTIVE = ("requested", "running")  # capacity placement may use
HELD = ("requested", "running", "draining", "releasing")  # exists (or may) at the provider
ENDED = ("failed", "released", "gone")  # a key we gave up: an instance listed for it is an orphan
KEY_NAMESPACE = uuid.UUID("5f3c2b9e-8d0a-4c1e-9a57-6b7f0e2d4c31")

Blocked = Literal["exhausted", "quota_exceeded", "failing", "outage"]


class Policy(BaseSettings):
    """Procurement knobs, from `GPUFLEET_PROCUREMENT_*` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="GPUFLEET_PROCUREMENT_", frozen=True, extra="ignore"
    )
    exhausted_cooldown_s: float = 300.0  # InsufficientCapacity: no new instances for this long
    quota_cooldown_s: float = 1800.0  # QuotaExceeded / InvalidRequest: no new tries for this long
    default_scale_down_delay_s: float = 300.0
    unhealthy_drain_s: float = 120.0
    default_notice_s: float = 120.0
    outage_share: float = 0.5  # more than this share of a pool unhealthy at once = outage
    outage_min_instances: int = 2  # ... and at least this many (one bad node is not an outage)
    max_retries: int = 6  # Throttled: Celery retries with backoff, then the sweep resumes
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    stale_request_s: float = 300.0  # a `requested` row this old is resumed by the sweep
    gone_grace_s: float = 60.0  # an instance missing from list_instances this long is gone


@dataclass(frozen=True, slots=True)
class PoolView:
    id: str
    purchase_type: str
    gpus_per_instance: int
    limit_gpus: int | None  # quota (on-demand/spot) or commitment (reserved); None = no limit
    scale_down_delay_s: float
    cluster_id: str | None = None
    blocked: Blocked | None = None  # no new instances while set


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    pool_id: str
    state: str
    health: str
    gpus: int
    created_at: datetime
    idle_since: datetime | None = None
    drain_deadline: datetime | None = None
    busy: bool = False  # replicas run on it
    idempotency_key: str = ""  # "" where the caller does not need it (decide)
    provider_instance_id: str | None = None
    updated_at: datetime | None = None  # last change of the row (None: never changed)


# -- decide: launches and releases ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acquire:
    pool_id: str
    count: int
    cluster_id: str | None = None
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kind: Literal["acquire"] = "acquire"


@dataclass(frozen=True, slots=True)
class Release:
    instance_id: str
    reason: Literal["idle", "drained"]
    kind: Literal["release"] = "release"


Action = Acquire | Release


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    idle: frozenset[str]  # instances not needed now (their scale-down clock runs)
    blocked: Mapping[str, str]  # pool -> why it gets no instances although it needs some
    idle_reserved_gpus: Mapping[str, int]  # reserved pools: paid-for GPUs the plan leaves unused


def decide(
    pools: Iterable[PoolView],
    instances: Iterable[InstanceView],
    wanted: Mapping[str, int],
    now: datetime,
) -> Decision:
    """What to do so each pool holds the GPUs `wanted` (GPUs the placement *uses* there,
    for every pool: a pool missing from `wanted` uses none).

    Per pool, `have` = GPUs of instances requested or running (a draining one does not
    count, so it is replaced):
    - draining instances past their deadline are released, except unhealthy ones in a
      pool with an outage (kept for inspection);
    - `want > have`: acquire the missing GPUs in whole instances, capped by the quota
      minus everything held (draining and releasing instances still use quota); nothing
      while the pool is blocked (`blocked` says why, or `quota_full`);
    - `want <= have`: whole surplus instances are idle (without replicas first, then the
      newest); an idle one goes once idle for the pool's scale-down delay, never a
      reserved one.
    """
    by_pool: dict[str, list[InstanceView]] = defaultdict(list)
    for inst in instances:
        if inst.state in HELD:
            by_pool[inst.pool_id].append(inst)
    actions: list[Action] = []
    idle: set[str] = set()
    blocked: dict[str, str] = {}
    idle_reserved: dict[str, int] = {}
    for pool in pools:
        held = by_pool.get(pool.id, [])
        want = max(0, wanted.get(pool.id, 0))
        actions.extend(Release(i.id, "drained") for i in held if _drained(pool, i, now))
        active = [i for i in held if i.state in ACTIVE]
        have = sum(i.gpus for i in active)
        if pool.purchase_type == "reserved":
            paid = pool.limit_gpus if pool.limit_gpus is not None else have
            idle_reserved[pool.id] = max(0, paid - want)
        if want > have:
            count = _to_acquire(pool, held, want - have)
            if pool.blocked:
                blocked[pool.id] = pool.blocked
            elif count == 0:
                blocked[pool.id] = "quota_full"
            else:
                actions.append(Acquire(pool.id, count, pool.cluster_id))
            continue
        surplus = have - want
        for inst in sorted(active, key=lambda i: (i.busy, -i.created_at.timestamp())):
            if inst.state != "running" or inst.gpus > surplus:
                continue
            surplus -= inst.gpus
            idle.add(inst.id)
            if pool.purchase_type == "reserved" or inst.idle_since is None:
                continue
            if now - inst.idle_since >= timedelta(seconds=pool.scale_down_delay_s):
                actions.append(Release(inst.id, "idle"))
    return Decision(tuple(actions), frozenset(idle), blocked, idle_reserved)


def _drained(pool: PoolView, inst: InstanceView, now: datetime) -> bool:
    due = inst.drain_deadline is not None and inst.drain_deadline <= now
    kept = pool.blocked == "outage" and inst.health == "unhealthy"
    return inst.state == "draining" and due and not kept


def _to_acquire(pool: PoolView, held: list[InstanceView], missing_gpus: int) -> int:
    count = math.ceil(missing_gpus / pool.gpus_per_instance)
    if pool.limit_gpus is None:
        return count
    headroom = pool.limit_gpus - sum(i.gpus for i in held)
    return max(0, min(count, headroom // pool.gpus_per_instance))


def instance_key(request_id: str, index: int) -> str:
    """The idempotency key of instance `index` of one acquire request: the same request
    (a Celery retry or redelivery keeps its task id) always yields the same keys."""
    return str(uuid.uuid5(KEY_NAMESPACE, f"{request_id}:{index}"))


# -- repair: our rows against the provider's list ------------------------------------------


@dataclass(frozen=True, slots=True)
class Adopt:
    row_id: str
    provider_instance_id: str


@dataclass(frozen=True, slots=True)
class Repairs:
    adopt: tuple[Adopt, ...] = ()  # requested rows the provider already has (the worker died)
    resume: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """pool id -> (row id, key) of stale requests, launched again with their own keys."""
    gone: tuple[str, ...] = ()  # rows whose instance the provider no longer lists
    release: tuple[str, ...] = ()  # releases stuck in `releasing`, run again
    orphans: tuple[str, ...] = ()  # provider ids launched for a key we gave up: deleted


def repair(
    rows: Iterable[InstanceView],
    listed: Sequence[ProviderInstance],
    now: datetime,
    policy: Policy,
) -> Repairs:
    """Level-based repair of one provider's rows (every state) against its `listed`
    instances. Age is the time since the row last changed.

    | row                    | at the provider            | then                          |
    |------------------------|----------------------------|-------------------------------|
    | requested              | listed for the row's key   | adopt it (running)            |
    | requested, stale       | not listed                 | resume with the same key      |
    | running, past grace    | not listed                 | gone                          |
    | draining               | not listed                 | gone (taken back)             |
    | running/draining       | listed, stopped            | gone, and delete it           |
    | releasing, stale       | any                        | release again                 |
    | failed/released/gone   | listed for the row's key   | delete that orphan            |
    """
    by_id = {i.id for i in listed}
    stopped = {i.id for i in listed if i.state is InstanceState.STOPPED}
    by_key = {i.idempotency_key: i for i in listed if i.idempotency_key}
    adopt: list[Adopt] = []
    resume: dict[str, list[tuple[str, str]]] = defaultdict(list)
    gone: list[str] = []
    release: list[str] = []
    orphans: list[str] = []
    for row in rows:
        age = (now - (row.updated_at or row.created_at)).total_seconds()
        made = by_key.get(row.idempotency_key)
        if row.state == "requested" and made is not None:
            adopt.append(Adopt(row.id, made.id))
        elif row.state == "requested" and age >= policy.stale_request_s:
            resume[row.pool_id].append((row.id, row.idempotency_key))
        elif row.state in ("running", "draining") and row.provider_instance_id in stopped:
            gone.append(row.id)  # it serves nothing and bills for its disks: replace it
            orphans.append(row.provider_instance_id)
        elif row.state in ("running", "draining") and row.provider_instance_id not in by_id:
            if age >= policy.gone_grace_s or row.state == "draining":
                gone.append(row.id)
        elif row.state == "releasing" and age >= policy.stale_request_s:
            release.append(row.id)
        elif row.state in ENDED and made is not None:
            orphans.append(made.id)
    return Repairs(
        tuple(adopt),
        {pool: tuple(todo) for pool, todo in resume.items()},
        tuple(gone),
        tuple(release),
        tuple(orphans),
    )


# -- on_failure: backoff and blocks --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """What a provider error on an acquire means."""

    error: str  # the ProviderError class name
    retry: bool = False  # Throttled: rows stay requested, the task runs again later
    block: Blocked | None = None  # the pool gets no new instances until `until`
    until: datetime | None = None
    replan: str | None = None  # the re-plan reason to send (the placement moves elsewhere)


def on_failure(exc: ProviderError, now: datetime, policy: Policy) -> Backoff:
    """| error                | rows      | pool                       | re-plan            |
    |----------------------|-----------|----------------------------|--------------------|
    | Throttled            | requested | unchanged (task retried)   | no                 |
    | Unavailable          | requested | unchanged (task retried)   | no                 |
    | InsufficientCapacity | failed    | exhausted, cool-down       | capacity_exhausted |
    | QuotaExceeded        | failed    | quota_exceeded, cool-down  | quota_exceeded     |
    | anything else        | failed    | failing, cool-down         | procurement_failed |
    """
    name = type(exc).__name__
    if isinstance(exc, Throttled | Unavailable):  # the same key again: never a second launch
        return Backoff(name, retry=True)
    if isinstance(exc, InsufficientCapacity):
        until = now + timedelta(seconds=policy.exhausted_cooldown_s)
        return Backoff(name, block="exhausted", until=until, replan="capacity_exhausted")
    until = now + timedelta(seconds=policy.quota_cooldown_s)
    if isinstance(exc, QuotaExceeded):
        return Backoff(name, block="quota_exceeded", until=until, replan="quota_exceeded")
    return Backoff(name, block="failing", until=until, replan="procurement_failed")


def backoff_s(attempt: int, rand: float, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base x 2^attempt)).
    `rand` in [0, 1) is passed in so the function stays pure."""
    return rand * min(cap_s, base_s * 2**attempt)


def retry_in_s(attempt: int, rand: float, policy: Policy) -> float | None:
    """The delay before retry `attempt` of a throttled task; None once the retries are
    spent (the reconcile sweep resumes the request later)."""
    if attempt >= policy.max_retries:
        return None
    return backoff_s(attempt, rand, policy.backoff_base_s, policy.backoff_cap_s)
