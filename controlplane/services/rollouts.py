"""Canary and blue-green rollouts, carried out: the record of each rollout (`m.Rollout`), its
start when a change gives a deployment a new revision, the operators' commands, and the tick
that asks `controlplane.rollouts.decide` where each running rollout goes next.

Invariants: at most one unfinished rollout per deployment (a later revision change ends it:
`superseded`); a rollout's steps are the deployment's `rollout` spec when it started; every
change of phase or step is an event and bumps the desired generation of the clusters that
serve the deployment (their lane and stable entries change). Callers own the transaction.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane import rollouts as canary
from controlplane.db import models as m
from controlplane.db.columns import (
    cluster_status,
    deployment_rollout,
    policy_of,
    rollout_policy,
    rollout_state,
)
from controlplane.errors import Conflict, NotFound
from controlplane.liveness import evidence_horizon
from controlplane.services import audit, rollout_windows
from controlplane.services.clusters import bus_progress
from controlplane.services.desired import bump_desired, clusters_serving
from controlplane.specs import REVISION_FIELDS, RolloutStrategy

log = logging.getLogger(__name__)

BEFORE = "before_switch"
"""`last_windows` key: the stable revision's window up to the switch to a step that gives
the new revision all the traffic (from the rollout's start for blue-green, from the last
hold's start for a canary's 100 % step), the baseline that step is judged against
(`rollouts.on_baseline`)."""
SUPERSEDED = "superseded"
"""A finished rollout's phase when a later change of the revision ended it (not a phase of
the pure decisions: it only ever names a finished row)."""
EVENT_TYPES = {
    canary.Phase.SCALING: "RolloutScaling",
    canary.Phase.HOLDING: "RolloutHolding",
    canary.Phase.KEEPING: "RolloutSwitched",
    canary.Phase.PAUSED: "RolloutPaused",
    canary.Phase.PROMOTED: "RolloutPromoted",
    canary.Phase.ROLLED_BACK: "RolloutRolledBack",
}
COMMANDS = {
    "pause": canary.pause,
    "resume": canary.resume,
    "promote": canary.promote,
    "rollback": canary.rollback,
}


def _store(row: m.Rollout, r: canary.Rollout) -> None:
    row.step, row.phase, row.since, row.reason = r.step, r.phase.value, r.since, r.reason
    row.paused_from = r.paused_from.value if r.paused_from else None


def running(session: Session, deployment_ids: list[str]) -> dict[str, m.Rollout]:
    """Deployment id → its unfinished rollout."""
    if not deployment_ids:
        return {}
    rows = session.scalars(
        select(m.Rollout).where(
            m.Rollout.deployment_id.in_(deployment_ids), m.Rollout.finished_at.is_(None)
        )
    )
    return {r.deployment_id: r for r in rows}


def latest(session: Session, deployment_id: str, for_update: bool = False) -> m.Rollout | None:
    """The deployment's newest rollout; ``for_update``: locked until the transaction ends
    (after the deployment's row, the order every writer takes)."""
    stmt = (
        select(m.Rollout)
        .where(m.Rollout.deployment_id == deployment_id)
        .order_by(m.Rollout.created_at.desc(), m.Rollout.id.desc())
        .limit(1)
    )
    return session.scalars(stmt.with_for_update() if for_update else stmt).first()


def next_revision(session: Session, deployment: m.Deployment) -> int:
    """A number no revision of the deployment had: a rollback sets `revision` back to the
    stable one, so the next change must not take the rolled-back revision's number again.
    Asked of the database: loading every stored revision made each change slower."""
    most = session.scalar(
        select(func.max(m.DeploymentRevision.revision)).where(
            m.DeploymentRevision.deployment_id == deployment.id
        )
    )
    return max(deployment.revision, most or 0) + 1


# start and supersede -----------------------------------------------------------------------


def on_revision_change(
    session: Session, deployment: m.Deployment, previous: int, now: datetime
) -> m.Rollout | None:
    """The deployment now has a new revision (`deployment.revision`); ``previous`` is the one
    it had. A running canary is ended (superseded); a canary starts from the same stable
    revision when the strategy is canary or blue_green and the deployment is placed
    somewhere. Returns the rollout started, if any."""
    stable = previous
    current = running(session, [deployment.id]).get(deployment.id)
    if current is not None:
        stable = current.from_revision
        current.phase, current.finished_at = SUPERSEDED, now
        current.reason = f"superseded by revision {deployment.revision}"
        _event(session, deployment, current, "RolloutSuperseded", current.reason)
    spec = deployment_rollout(deployment)
    if spec.strategy is RolloutStrategy.immediate or not _placed(session, deployment.id):
        return None
    started = canary.start(now, policy_of(spec))
    row = m.Rollout(
        deployment_id=deployment.id,
        from_revision=stable,
        to_revision=deployment.revision,
        strategy=spec.strategy.value,
        policy=spec.model_dump(mode="json"),
        # blue-green: the stable revision's traffic from here to the switch is its baseline
        window_start=(
            rollout_windows.outcomes_of(session, deployment.name, deployment.revision)
            if spec.strategy is RolloutStrategy.blue_green
            else {}
        ),
        last_windows={},
        created_at=now,
    )
    _store(row, started)
    session.add(row)
    session.flush()
    message = (
        f"{spec.strategy.value} from revision {stable} to {deployment.revision}: {started.reason}"
    )
    _event(session, deployment, row, "RolloutStarted", message)
    return row


def _placed(session: Session, deployment_id: str) -> int:
    return (
        session.scalar(
            select(func.coalesce(func.sum(m.Placement.replicas), 0)).where(
                m.Placement.deployment_id == deployment_id
            )
        )
        or 0
    )


# reading ------------------------------------------------------------------------------------


def _deployment(session: Session, ref: str, for_update: bool = False) -> m.Deployment:
    stmt = select(m.Deployment).where((m.Deployment.name == ref) | (m.Deployment.id == ref))
    if for_update:
        stmt = stmt.with_for_update(of=m.Deployment)
    row = session.scalars(stmt).first()
    if row is None:
        raise NotFound(f"Deployment '{ref}' does not exist; list them with GET /api/v1/deployments")
    return row


def view(row: m.Rollout, deployment: m.Deployment) -> dict[str, Any]:
    """The API's representation of a rollout."""
    policy = rollout_policy(row)
    try:
        now_share = canary.share(rollout_state(row), policy)
    except ValueError:  # superseded: no pure phase; its lane is retired
        now_share = 0.0
    keeping = row.phase == canary.Phase.KEEPING.value and policy.keep_s is not None
    return {
        "id": row.id,
        "deployment": deployment.name,
        "strategy": row.strategy,
        "from_revision": row.from_revision,
        "to_revision": row.to_revision,
        "lane": canary.lane_name(deployment.name, row.to_revision),
        "phase": row.phase,
        "step": row.step,
        "steps": list(policy.steps),
        "share": now_share,
        "reason": row.reason,
        "since": row.since.isoformat(),
        "paused_from": row.paused_from,
        "windows": dict(row.last_windows or {}),
        "keep_seconds": policy.keep_s,
        "keep_until": (
            (row.since + timedelta(seconds=policy.keep_s)).isoformat()
            if keeping and policy.keep_s is not None
            else None
        ),
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat() if row.updated_at else None,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }


def get(session: Session, ref: str) -> dict[str, Any]:
    """The deployment's current rollout, or its last one."""
    deployment = _deployment(session, ref)
    row = latest(session, deployment.id)
    if row is None:
        raise NotFound(
            f"deployment '{deployment.name}' has had no rollout; one starts when a change of "
            f"its revision fields meets rollout.strategy: canary or blue_green"
        )
    return view(row, deployment)


# commands and the tick ---------------------------------------------------------------------


def command(
    session: Session,
    ref: str,
    verb: str,
    now: datetime,
    actor: str,
    request_id: str | None = None,
) -> dict[str, Any]:
    """pause, resume, promote or rollback the deployment's running rollout, audited."""
    deployment = _deployment(session, ref, for_update=True)
    row = latest(session, deployment.id, for_update=True)
    if row is None:
        raise NotFound(f"deployment '{deployment.name}' has no rollout to {verb}")
    if row.finished_at is not None:
        raise Conflict(
            f"the rollout of '{deployment.name}' to revision {row.to_revision} is done "
            f"({row.phase}); a new one starts with the next change of its revision"
        )
    before = view(row, deployment)
    after_state = COMMANDS[verb](rollout_state(row), now)
    if after_state == rollout_state(row):
        raise Conflict(
            f"cannot {verb} the rollout of '{deployment.name}': it is {row.phase}"
            + ("; pause it first" if verb == "resume" else "")
        )
    apply(session, deployment, row, after_state, now)
    after = view(row, deployment)
    audit.record(
        session,
        actor=actor,
        action=verb,
        kind="Rollout",
        resource_id=row.id,
        name=deployment.name,
        before=before,
        after=after,
        request_id=request_id,
    )
    return after


def apply(
    session: Session,
    deployment: m.Deployment,
    row: m.Rollout,
    new: canary.Rollout,
    now: datetime,
    latest_outcomes: dict[str, dict[str, Any]] | None = None,
) -> bool:
    """Store ``new``; a new phase or step is an event and bumps the serving clusters. A
    hold that begins takes the routers' counters now as its window's start. True when the
    phase or step changed."""
    old = rollout_state(row)
    if new == old:
        return False
    _store(row, new)
    moved = (new.phase, new.step, new.since) != (old.phase, old.step, old.since)
    if not moved:
        return False  # only the reason (e.g. how many requests are missing)
    if new.phase in (canary.Phase.HOLDING, canary.Phase.KEEPING):
        if latest_outcomes is None:
            latest_outcomes = rollout_windows.outcomes_of(session, deployment.name, row.to_revision)
        if old.phase is canary.Phase.SCALING and canary.on_baseline(new, rollout_policy(row)):
            before, _ = rollout_windows.windows(
                row.window_start or {}, latest_outcomes, deployment.name, row.to_revision
            )  # the switch: what the stable revision served until now is the baseline
            row.last_windows = {
                **(row.last_windows or {}),
                BEFORE: rollout_windows.window_json(before),
            }
        row.window_start = latest_outcomes
    if new.done:
        row.finished_at = now
        if new.phase is canary.Phase.ROLLED_BACK:
            _restore_stable(session, deployment, row)
    kind = "RolloutResumed" if old.phase is canary.Phase.PAUSED and not new.done else None
    _event(session, deployment, row, kind or EVENT_TYPES[new.phase], new.reason)
    bump_desired(session, clusters_serving(session, [deployment.id]))
    return True


def _restore_stable(session: Session, deployment: m.Deployment, row: m.Rollout) -> None:
    """Rolled back: the deployment's revision fields are the stable revision's again, at its
    number, so that the stable replicas everywhere stay as they are."""
    stored = session.scalars(
        select(m.DeploymentRevision).where(
            m.DeploymentRevision.deployment_id == deployment.id,
            m.DeploymentRevision.revision == row.from_revision,
        )
    ).first()
    if stored is None:
        return
    for field in REVISION_FIELDS:
        if field in stored.spec:
            setattr(deployment, field, stored.spec[field])
    deployment.revision = row.from_revision
    deployment.generation += 1


def tick(
    session: Session, now: datetime, stale_after: timedelta = timedelta(seconds=15)
) -> dict[str, str]:
    """One look at every running rollout: deployment name → the phase it moved to, for the
    rollouts whose phase or step moved. Locks as a write does, the deployment then its
    rollout; one that a write or another worker holds is skipped until the next tick.

    Nothing moves while the bus process is behind the reports stream (frozen, dead or
    slow: ``liveness.evidence_horizon``): the planes' outcome counters stop there, and a
    window with too few requests passes its gates — a failing revision was promoted
    while its errors sat unread in the stream."""
    _horizon, behind = evidence_horizon(now, bus_progress(session), stale_after)
    if behind is not None:
        log.info("rollouts held: %s", behind)
        return {}
    ids = session.scalars(
        select(m.Rollout.deployment_id).where(
            m.Rollout.finished_at.is_(None), m.Rollout.phase != canary.Phase.PAUSED.value
        )
    ).all()
    moved: dict[str, str] = {}
    for deployment_id in ids:
        deployment = session.scalars(
            select(m.Deployment)
            .where(m.Deployment.id == deployment_id)
            .with_for_update(of=m.Deployment, skip_locked=True)
        ).first()
        row = (
            deployment
            and session.scalars(
                select(m.Rollout)
                .where(m.Rollout.deployment_id == deployment_id, m.Rollout.finished_at.is_(None))
                .with_for_update(skip_locked=True)
            ).first()
        )
        if deployment is None or row is None or row.phase == canary.Phase.PAUSED.value:
            continue
        if _look(session, deployment, row, now):
            moved[deployment.name] = row.phase
    return moved


def _look(session: Session, deployment: m.Deployment, row: m.Rollout, now: datetime) -> bool:
    latest_outcomes = rollout_windows.outcomes_of(session, deployment.name, row.to_revision)
    stable, new = rollout_windows.windows(
        row.window_start or {}, latest_outcomes, deployment.name, row.to_revision
    )
    before = (row.last_windows or {}).get(BEFORE)
    row.last_windows = {
        "stable": rollout_windows.window_json(stable),
        "new": rollout_windows.window_json(new),
        **({BEFORE: before} if before else {}),
    }
    state, policy = rollout_state(row), rollout_policy(row)
    if state.phase in (canary.Phase.KEEPING, canary.Phase.HOLDING) and canary.on_baseline(
        state, policy
    ):  # judged against the stable's baseline: it has no traffic now
        stable = rollout_windows.window_from_json(before)
    decided = canary.decide(
        state,
        policy,
        now,
        new_ready=_ready(session, deployment.id, row.to_revision),
        total=_placed(session, deployment.id),
        new=new,
        stable=stable,
        waiting=_waiting(session, deployment) if row.phase == canary.Phase.SCALING.value else {},
    )
    return apply(session, deployment, row, decided, now, latest_outcomes)


def _waiting(session: Session, deployment: m.Deployment) -> dict[str, int]:
    """``cluster/pool`` → the deployment's replicas its planes last said cannot start there
    for want of GPUs (a rollout's lane counts for its deployment)."""
    clusters = session.scalars(
        select(m.Cluster).where(m.Cluster.id.in_(clusters_serving(session, [deployment.id])))
    )
    return {
        f"{c.name}/{pool}": n
        for c in clusters
        for pool, cap in cluster_status(c).capacity.items()
        if (n := cap.waiting_replicas.get(deployment.name, 0)) > 0
    }


def _ready(session: Session, deployment_id: str, revision: int) -> int:
    return (
        session.scalar(
            select(func.count())
            .select_from(m.Replica)
            .join(m.Cluster, m.Cluster.id == m.Replica.cluster_id)
            .where(
                m.Replica.deployment_id == deployment_id,
                m.Replica.revision == revision,
                m.Replica.state == "ready",
                m.Cluster.state != "down",  # a dead plane's last report serves nobody
            )
        )
        or 0
    )


def _event(
    session: Session, deployment: m.Deployment, row: m.Rollout, kind: str, message: str
) -> None:
    session.add(
        m.Event(
            type=kind,
            object_kind="Deployment",
            object_id=deployment.id,
            object_name=deployment.name,
            message=f"{deployment.name}: {message}",
            data={
                "rollout": row.id,
                "from_revision": row.from_revision,
                "to_revision": row.to_revision,
                "phase": row.phase,
                "step": row.step,
            },
        )
    )
