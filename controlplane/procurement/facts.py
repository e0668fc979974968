"""What agents and providers report about instances: spot notices and bad nodes, and the
outage a pool is in when too many of its nodes go bad at once.

Each function runs in the caller's transaction and returns True when a re-plan should run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.db.columns import pool_status, set_status
from controlplane.db.models import Instance, Pool
from controlplane.procurement.core import ACTIVE, Policy
from controlplane.procurement.store import event


def find_instance(session: Session, ref: str) -> Instance | None:
    """By provider instance id (what agents and providers know) or by our own id."""
    found = session.scalars(
        select(Instance).where(Instance.provider_instance_id == ref).with_for_update()
    ).first()
    return found or session.get(Instance, ref, with_for_update=True)


def note_interruption(
    session: Session,
    ref: str,
    deadline: datetime | None,
    now: datetime,
    source: str,
    policy: Policy | None = None,
) -> bool:
    """A spot notice: the instance drains (placement no longer counts it) until `deadline`."""
    inst = find_instance(session, ref)
    if inst is None or inst.state not in ACTIVE:
        return False
    pool = session.get_one(Pool, inst.pool_id)
    notice = pool.notice_seconds or (policy or Policy()).default_notice_s
    # a deadline already past means now (a reported one could be year 1, which the
    # agent's drain-lead arithmetic cannot take)
    # and one far ahead (a skewed or forged plane clock) is the pool's notice: drained
    # for good, the instance was billed beside its replacement
    longest = now + timedelta(seconds=notice)
    until = min(max(deadline, now), longest) if deadline is not None else longest
    inst.state, inst.drain_deadline = "draining", until
    event(
        session,
        "InstanceDraining",
        inst,
        f"instance {inst.provider_instance_id} in pool {pool.name} will be taken back at "
        f"{until.isoformat()} (spot interruption, from {source}); "
        "replicas move off it and a replacement is planned",
        reason="spot_interruption",
        source=source,
        pool=pool.name,
        deadline=until.isoformat(),
    )
    return True


def note_unhealthy(
    session: Session, ref: str, reason: str, now: datetime, policy: Policy | None = None
) -> bool:
    """A bad node: cordoned and drained, then replaced; too many bad nodes in one pool at
    once is a provider outage: the pool gets no replacements until an operator looks."""
    policy = policy or Policy()
    inst = find_instance(session, ref)
    if inst is None or inst.health == "unhealthy" or inst.state not in (*ACTIVE, "draining"):
        return False
    pool = session.get_one(Pool, inst.pool_id, with_for_update={"of": Pool})
    inst.health = "unhealthy"
    if inst.state in ACTIVE:
        inst.state = "draining"
        inst.drain_deadline = now + timedelta(seconds=policy.unhealthy_drain_s)
    event(
        session,
        "InstanceCordoned",
        inst,
        f"instance {inst.provider_instance_id} in pool {pool.name} is unhealthy ({reason}); "
        "cordoned, drained and replaced",
        reason=reason,
        pool=pool.name,
    )
    states = ("running", "draining")
    members = list(
        session.scalars(
            select(Instance).where(Instance.pool_id == pool.id, Instance.state.in_(states))
        )
    )
    bad = sum(1 for m in members if m.health == "unhealthy")
    share = bad / len(members) if members else 0.0
    outage = bad >= policy.outage_min_instances and share > policy.outage_share
    if outage and pool_status(pool).outage is None:
        why = (
            f"{bad} of {len(members)} instances unhealthy at once (more than "
            f"{policy.outage_share:.0%}): a provider outage, not a bad node"
        )
        set_status(pool, outage={"since": now.isoformat(), "message": why})
        event(
            session,
            "PoolOutageSuspected",
            pool,
            f"pool {pool.name}: {why}; automatic replacement stopped. Clear "
            "status.outage (procurement.facts.clear_outage) once the provider recovers",
            unhealthy=bad,
            instances=len(members),
        )
    return True


def clear_outage(session: Session, pool_id: str) -> None:
    pool = session.get_one(Pool, pool_id, with_for_update={"of": Pool})
    set_status(pool, outage=None)
    event(session, "PoolOutageCleared", pool, f"pool {pool.name}: outage cleared")
