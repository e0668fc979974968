"""The gates' windows (docs/rollouts.md): the routers' outcome counters as last reported per
(cluster, entry), and what each revision's entry served since a hold began, summed over
the clusters (`rollouts.outcomes_delta`, `rollouts.window_of`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from controlplane import rollouts as canary
from controlplane.contracts import DeploymentObserved, OutcomeCounters
from controlplane.db import models as m


def record_outcomes(session: Session, cluster: str, reports: Iterable[DeploymentObserved]) -> None:
    """Keep the last outcome counters each entry's router reported on ``cluster`` (the
    report as it may count, `controlplane.trust`)."""
    for report in reports:
        if report.outcomes is None:
            continue
        counters = report.outcomes.model_dump(mode="json")
        stmt = insert(m.RouterOutcomes).values(
            cluster=cluster, entry=report.name, counters=counters
        )
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["cluster", "entry"],
                set_={"counters": stmt.excluded.counters, "updated_at": func.now()},
            )
        )


def outcomes_of(session: Session, deployment: str, to_revision: int) -> dict[str, Any]:
    """cluster → entry → the last `OutcomeCounters` (JSON) its router reported, for the
    deployment's stable entry and its lane."""
    entries = [deployment, canary.lane_name(deployment, to_revision)]
    out: dict[str, dict[str, Any]] = {}
    for row in session.scalars(select(m.RouterOutcomes).where(m.RouterOutcomes.entry.in_(entries))):
        out.setdefault(row.cluster, {})[row.entry] = row.counters
    return out


def windows(
    start: dict[str, Any], now: dict[str, Any], deployment: str, to_revision: int
) -> tuple[canary.Window, canary.Window]:
    """(stable, new): each entry's counters now minus at the window's start, per cluster,
    summed (`rollouts.window_of`). A cluster with no counters at the start counts whole."""
    lane = canary.lane_name(deployment, to_revision)
    deltas: dict[str, list[OutcomeCounters]] = {deployment: [], lane: []}
    for cluster, entries in now.items():
        for entry, counters in entries.items():
            if entry not in deltas:
                continue
            before = _counters((start.get(cluster) or {}).get(entry))
            after = _counters(counters)
            if after is not None:
                deltas[entry].append(canary.outcomes_delta(before, after))
    return canary.window_of(deltas[deployment]), canary.window_of(deltas[lane])


def _counters(raw: Any) -> OutcomeCounters | None:
    try:
        return OutcomeCounters.model_validate(raw) if raw else None
    except ValidationError:
        return None


def window_json(w: canary.Window) -> dict[str, Any]:
    return {
        "requests": w.requests,
        "errors": w.errors,
        "error_rate": w.error_rate,
        "p99_ttft_s": w.p99_ttft_s,
        "p99_e2e_s": w.p99_e2e_s,
    }


def window_from_json(raw: Any) -> canary.Window:
    """A stored `window_json` (nothing stored: an empty window)."""
    raw = raw or {}
    return canary.Window(
        requests=int(raw.get("requests", 0)),
        errors=int(raw.get("errors", 0)),
        p99_ttft_s=float(raw.get("p99_ttft_s", 0.0)),
        p99_e2e_s=float(raw.get("p99_e2e_s", 0.0)),
    )
