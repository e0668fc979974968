"""Rollout lanes in a cluster's desired state (docs/rollouts.md): while a canary runs, a
deployment placed here is two entries, the stable revision under its own name and the new
one as the lane `NAME--rREVISION` (`rollouts.lane_entries` decides their sizes); a finished
rollout's lane is listed in `retired` so that the plane drains it at once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane import rollouts as canary
from controlplane.contracts import DeploymentDesired, RevisionSpec
from controlplane.db.columns import rollout_policy, rollout_state
from controlplane.db.models import Deployment, DeploymentRevision, Rollout


@dataclass(frozen=True)
class Canary:
    lane: str
    stable: RevisionSpec
    state: canary.Rollout
    policy: canary.CanaryPolicy


def running_canaries(session: Session, deployments: Iterable[Deployment]) -> dict[str, Canary]:
    """Deployment name → its running canary, for these deployments."""
    by_id = {d.id: d for d in deployments}
    if not by_id:
        return {}
    rows = session.execute(
        select(Rollout, DeploymentRevision)
        .join(
            DeploymentRevision,
            (DeploymentRevision.deployment_id == Rollout.deployment_id)
            & (DeploymentRevision.revision == Rollout.from_revision),
        )
        .where(Rollout.deployment_id.in_(list(by_id)), Rollout.finished_at.is_(None))
    ).all()
    out: dict[str, Canary] = {}
    for row, stable in rows:
        deployment = by_id[row.deployment_id]
        out[deployment.name] = Canary(
            lane=canary.lane_name(deployment.name, row.to_revision),
            stable=revision_spec(stable.spec, stable.revision),
            state=rollout_state(row),
            policy=rollout_policy(row),
        )
    return out


def revision_spec(stored: Mapping[str, object], revision: int) -> RevisionSpec:
    """A stored revision (`DeploymentRevision.spec`) as the planes run it."""
    return RevisionSpec.model_validate({**stored, "revision": f"{revision}"})


def with_lanes(
    entries: Iterable[DeploymentDesired], here: Mapping[str, int], canaries: Mapping[str, Canary]
) -> list[DeploymentDesired]:
    """Each entry, split into its stable entry and its lane where a canary runs
    (``here``: replicas placed on this cluster per deployment)."""
    out: list[DeploymentDesired] = []
    for entry in entries:
        c = canaries.get(entry.name)
        if c is None:
            out.append(entry)
            continue
        out.extend(
            canary.lane_entries(entry, here.get(entry.name, 0), c.stable, c.state, c.policy, c.lane)
        )
    return out


def retired_lanes(session: Session, within: timedelta) -> list[str]:
    """Lanes of rollouts that finished within ``within`` (promoted, rolled back or
    superseded) and that no running rollout uses again."""
    finished = session.execute(
        select(Deployment.name, Rollout.to_revision, Rollout.finished_at.is_(None))
        .join(Deployment, Deployment.id == Rollout.deployment_id)
        .where(
            Rollout.finished_at.is_(None) | (Rollout.finished_at >= func.now() - within),
        )
    ).all()
    running = {canary.lane_name(n, r) for n, r, unfinished in finished if unfinished}
    return sorted({canary.lane_name(n, r) for n, r, _ in finished} - running)
