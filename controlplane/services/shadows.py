"""A deployment's shadow revision on the planes and its report (docs/rollouts.md#shadow-
traffic; the pure part is `controlplane.shadows`): the shadow lane in each cluster's desired
state, the lane retired when the shadow is removed, and live vs shadow side by side."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane import shadows
from controlplane.contracts import DeploymentDesired, OutcomeCounters
from controlplane.db import models as m
from controlplane.errors import NotFound
from controlplane.specs import ShadowSpec


def shadow_of(row: m.Deployment) -> ShadowSpec | None:
    """The deployment's shadow spec as stored (None: none, or one beyond today's limits)."""
    if not row.shadow:
        return None
    try:
        return ShadowSpec.model_validate(row.shadow)
    except ValidationError:
        return None


def with_shadows(
    entries: Iterable[DeploymentDesired],
    here: Mapping[str, int],
    deployments: Mapping[str, m.Deployment],
) -> list[DeploymentDesired]:
    """The entries, each deployment placed here (``here``: its replicas on this cluster)
    followed by its shadow lane when it has a shadow. A rollout lane gets none: the shadow
    copies the requests its deployment's own entry answers."""
    out: list[DeploymentDesired] = []
    for entry in entries:
        out.append(entry)
        row = deployments.get(entry.name)
        shadow = shadow_of(row) if row is not None else None
        if shadow is not None and here.get(entry.name, 0) > 0:
            out.append(shadows.shadow_entry(entry, shadow))
    return out


def retired_shadows(session: Session, within: timedelta) -> list[str]:
    """Shadow lanes of deployments whose shadow a user removed (or that a user deleted)
    within ``within`` (the audit log) and that have none now: drained at once."""
    had = select(m.AuditEntry.resource_name).where(
        m.AuditEntry.action.in_(("update", "delete")),
        m.AuditEntry.resource_kind == "Deployment",
        m.AuditEntry.resource_name.is_not(None),
        m.AuditEntry.before.has_key("shadow"),
        m.AuditEntry.time >= func.now() - within,
    )
    names = {n for n in session.scalars(had.distinct()) if n is not None}
    if not names:
        return []
    kept = set(
        session.scalars(
            select(m.Deployment.name).where(
                m.Deployment.name.in_(sorted(names)), m.Deployment.shadow.is_not(None)
            )
        )
    )
    return sorted(shadows.shadow_name(n) for n in names - kept)


def note_change(
    session: Session, row: m.Deployment, before: Mapping[str, Any], after: Mapping[str, Any]
) -> None:
    """A write of the deployment: a shadow set or changed starts the report's window now."""
    if after.get("shadow") != before.get("shadow"):
        row.shadow_window = _counters_json(session, row.name) if after.get("shadow") else None


def _counters_json(session: Session, deployment: str) -> dict[str, dict[str, Any]]:
    entries = [deployment, shadows.shadow_name(deployment)]
    out: dict[str, dict[str, Any]] = {}
    for r in session.scalars(select(m.RouterOutcomes).where(m.RouterOutcomes.entry.in_(entries))):
        out.setdefault(r.cluster, {})[r.entry] = r.counters
    return out


def _parsed(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, OutcomeCounters]]:
    out: dict[str, dict[str, OutcomeCounters]] = {}
    for cluster, entries in raw.items():
        for entry, counters in entries.items():
            try:
                out.setdefault(cluster, {})[entry] = OutcomeCounters.model_validate(counters)
            except ValidationError:
                continue  # not counters: that entry counts whole from the next report
    return out


def report(session: Session, ref: str) -> dict[str, Any]:
    """Live vs shadow over the window since the shadow was last set or changed (404: the
    deployment does not exist or has no shadow)."""
    row = session.scalars(
        select(m.Deployment).where((m.Deployment.name == ref) | (m.Deployment.id == ref))
    ).first()
    if row is None:
        raise NotFound(f"Deployment '{ref}' does not exist; list them with GET /api/v1/deployments")
    shadow = shadow_of(row)
    if shadow is None:
        raise NotFound(
            f"deployment '{row.name}' has no shadow; set one with a shadow: {{share: 0.1}} "
            "block in its spec (docs/rollouts.md#shadow-traffic)"
        )
    now = _parsed(_counters_json(session, row.name))
    live, mirrored = shadows.sides(_parsed(row.shadow_window or {}), now, row.name)
    return {
        "deployment": row.name,
        "lane": shadows.shadow_name(row.name),
        "spec": shadow.model_dump(mode="json", exclude_none=True),
        "clusters": sorted(c for c, e in now.items() if shadows.shadow_name(row.name) in e),
        "live": side_json(live),
        "shadow": side_json(mirrored),
    }


def side_json(side: shadows.Side) -> dict[str, Any]:
    return {
        "requests": side.requests,
        "errors": side.errors,
        "error_rate": side.error_rate,
        "p50_ttft_s": side.p50_ttft_s,
        "p99_ttft_s": side.p99_ttft_s,
        "p50_e2e_s": side.p50_e2e_s,
        "p99_e2e_s": side.p99_e2e_s,
        "dropped": side.dropped,
    }
