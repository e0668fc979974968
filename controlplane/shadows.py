"""Shadow traffic, pure (docs/rollouts.md#shadow-traffic): a deployment's shadow revision as
one more entry of each cluster's desired state, and the report that puts the shadow's
outcomes beside the live deployment's over the same window. No I/O, no clock.

The shadow lane ``NAME--shadow`` serves ``NAME`` with ``mirror: true``: each plane's router
copies ``share`` of ``NAME``'s requests to it, fire and forget (the user's answer never waits
for the copy; too many copies in flight are dropped and counted), and discards its answers.
It runs exactly ``replicas`` replicas on every cluster the deployment is placed on, never
scaled to zero. `specs.DeploymentSpec` refuses deployment names that end like a shadow lane.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane import rollouts
from controlplane.contracts import DeploymentDesired, OutcomeCounters, ReplicaQuota
from controlplane.specs import SHADOW_SUFFIX, ShadowSpec

CHANGED_FIELDS = ("model_id", "model_revision", "engine_image", "engine_args")
"""The revision fields a shadow may change (its GPUs per replica and types are the
deployment's: it runs on the pools the deployment is placed on)."""


def shadow_name(deployment: str) -> str:
    """The desired-state entry of ``deployment``'s shadow revision."""
    return f"{deployment}{SHADOW_SUFFIX}"


def shadow_of(entry: str) -> str | None:
    """The deployment whose shadow lane ``entry`` is, else None."""
    if entry.endswith(SHADOW_SUFFIX) and len(entry) > len(SHADOW_SUFFIX):
        return entry[: -len(SHADOW_SUFFIX)]
    return None


def shadow_revision(base: str, shadow: ShadowSpec) -> str:
    """The shadow's revision identifier: the deployment's revision it is based on and a
    digest of the fields it changes, so that a change of either restarts its replicas (and
    a change of its share or replicas does not). Never all digits: no deployment revision."""
    changes = shadow.model_dump(mode="json", include=set(CHANGED_FIELDS), exclude_none=True)
    digest = hashlib.sha256(json.dumps(changes, sort_keys=True).encode()).hexdigest()[:8]
    return f"{base}-shadow-{digest}"


def shadow_entry(entry: DeploymentDesired, shadow: ShadowSpec) -> DeploymentDesired:
    """The shadow lane beside the deployment's entry on one cluster: ``entry``'s revision
    with the shadow's changes, mirrored ``share`` of the requests, at exactly ``replicas``
    replicas in any of the entry's pools, with no scale to zero and no schedule."""
    changes = shadow.model_dump(include=set(CHANGED_FIELDS), exclude_none=True)
    spec = entry.spec.model_copy(
        update={**changes, "revision": shadow_revision(entry.spec.revision, shadow)}
    )
    auto = entry.autoscaling.model_copy(update={"scale_to_zero_idle_seconds": None, "schedule": []})
    return entry.model_copy(
        update={
            "name": shadow_name(entry.name),
            "spec": spec,
            "serves": entry.name,
            "mirror": True,
            "traffic_share": shadow.share,
            "quota": ReplicaQuota(min=shadow.replicas, max=shadow.replicas),
            "pool_quotas": [],
            "hold_leaving": 0,
            "autoscaling": auto,
        }
    )


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side (live or shadow) of the report over its window, summed over the clusters."""

    requests: int
    errors: int
    p50_ttft_s: float
    p99_ttft_s: float
    p50_e2e_s: float
    p99_e2e_s: float
    dropped: int = 0
    """Copies the routers dropped (the shadow side only): never sent, not in ``requests``."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def delta(before: OutcomeCounters | None, after: OutcomeCounters) -> OutcomeCounters:
    """``rollouts.outcomes_delta`` with the dropped copies too."""
    moved = rollouts.outcomes_delta(before, after)
    if before is None or before.since != after.since:
        dropped = after.dropped  # a new router (or the first report): it counts from zero
    else:
        dropped = max(0, after.dropped - before.dropped)
    return moved.model_copy(update={"dropped": dropped})


def side_of(deltas: Sequence[OutcomeCounters]) -> Side:
    """One side from its deltas on every cluster (bucket counts add up)."""
    width = max((len(b) for d in deltas for b in (d.ttft_buckets, d.e2e_buckets)), default=0)

    def added(pick: str) -> list[int]:
        lists = [getattr(d, pick) for d in deltas]
        return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]

    ttft, e2e = added("ttft_buckets"), added("e2e_buckets")
    return Side(
        requests=sum(d.requests for d in deltas),
        errors=sum(d.errors for d in deltas),
        p50_ttft_s=rollouts.quantile_of(ttft, 0.5),
        p99_ttft_s=rollouts.quantile_of(ttft, 0.99),
        p50_e2e_s=rollouts.quantile_of(e2e, 0.5),
        p99_e2e_s=rollouts.quantile_of(e2e, 0.99),
        dropped=sum(d.dropped for d in deltas),
    )


def sides(
    start: dict[str, dict[str, OutcomeCounters]],
    now: dict[str, dict[str, OutcomeCounters]],
    deployment: str,
) -> tuple[Side, Side]:
    """(live, shadow) over the window from ``start`` to ``now`` (cluster → entry → the
    counters its router reported): each entry's counters now minus at the start, per
    cluster, summed. A cluster with no counters at the start counts whole; a router that
    restarted counts from its new start."""
    lane = shadow_name(deployment)
    deltas: dict[str, list[OutcomeCounters]] = {deployment: [], lane: []}
    for cluster, entries in now.items():
        for entry, after in entries.items():
            if entry in deltas:
                deltas[entry].append(delta(start.get(cluster, {}).get(entry), after))
    return side_of(deltas[deployment]), side_of(deltas[lane])
