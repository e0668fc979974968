"""Faults found under load (issue 12, items 2 and 4), against the running `up` fleet: the
control plane's own blind spot is not taken for the planes' death, and one plane's
credentials cannot drive global placement or spending."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import nats

from controlplane.contracts import (
    DeploymentObserved,
    ObservedState,
    ReplicaStatus,
    observed_subject,
)
from tests.integration.faults.conftest import CLUSTERS, Fleet
from tests.integration.test_up import _wait_until


def _assignments(fleet: Fleet, deployment: str) -> list[tuple[str, str, int]]:
    placement = fleet.api.get("/api/v1/placement").json()
    return sorted(
        (a["cluster"], a["pool"], a["replicas"])
        for a in placement["assignments"]
        if a["deployment"] == deployment
    )


def _events(fleet: Fleet, **filters: str) -> list[dict[str, Any]]:
    answer = fleet.api.get("/api/v1/events", params={**filters, "limit": 500})
    answer.raise_for_status()
    return answer.json()["items"]


async def _publish_as(fleet: Fleet, cluster: str, subject: str, payload: str) -> None:
    conn = await nats.connect(fleet.nats_url, **fleet.nats_credentials(cluster))
    try:
        await conn.jetstream().publish(subject, payload.encode())
    finally:
        await conn.close()


def test_a_stalled_bus_process_is_not_taken_for_the_planes_death(fleet: Fleet) -> None:
    """Item 2: with only the control plane's NATS process frozen past the down threshold,
    every cluster was declared down, re-planned empty, and every agent stopped every replica
    when the bus came back."""
    for deployment in ("eu-assistant", "triage-llm"):
        fleet.serving(deployment)
    before = {c: fleet.replica_pids(c) for c in CLUSTERS}
    downs_before = len(_events(fleet, type="ClusterDown"))
    bus = fleet.child("controlplane.cli bus")
    os.killpg(bus.pid, signal.SIGSTOP)
    try:
        frozen_until = time.monotonic() + 30  # > the 20 s down threshold + a 5 s check
        while time.monotonic() < frozen_until:
            assert fleet.router_serves()
            time.sleep(1)
    finally:
        os.killpg(bus.pid, signal.SIGCONT)
    _wait_until(
        lambda: all(
            c["status"]["state"] == "healthy"
            for c in fleet.api.get("/api/v1/clusters").json()["items"]
        ),
        30,
        "every cluster to be healthy again",
    )
    assert len(_events(fleet, type="ClusterDown")) == downs_before, "a blind spot taken for death"
    assert _events(fleet, type="LivenessSuspended"), "the suspension is told"
    for cluster in CLUSTERS:
        after = fleet.replica_pids(cluster)
        assert after == before[cluster] or set(before[cluster]) <= set(after), (
            f"{cluster} stopped replicas it was serving: {before[cluster]} → {after}"
        )
    assert "eu-assistant" in fleet.models("euc1-a")


def test_a_forged_heartbeat_cannot_drive_placement_or_spending(fleet: Fleet) -> None:
    """Item 4: one well-formed heartbeat on a plane's own subject claimed demand 6 for a
    deployment it does not run; the control plane re-planned it to 6 replicas ($103/h) and
    dispatched procurement of 8 on-demand H100s. A fake "ready" replica was accepted too."""
    fleet.serving("triage-llm")
    placed = _assignments(fleet, "triage-llm")
    runs_there = {c for c, _, _ in placed}
    forger = next(c for c in CLUSTERS if c not in runs_there)
    instances = len(fleet.api.get("/api/v1/instances").json()["items"])
    earlier = [e["message"] for e in _events(fleet, type="ReportRejected", object_name=forger)]
    forged = ObservedState(
        cluster=forger,
        source=f"cluster/{forger}",
        deployments=[DeploymentObserved(name="triage-llm", demand=6, in_flight=400)],
        replicas=[
            ReplicaStatus(
                replica_id="forged-1", deployment="triage-llm", revision="r1", state="ready"
            )
        ],
    )
    asyncio.run(_publish_as(fleet, forger, observed_subject(forger), forged.model_dump_json()))
    _wait_until(
        lambda: len(_events(fleet, type="ReportRejected", object_name=forger)) > len(earlier),
        20,
        f"the control plane to reject {forger}'s report about a deployment it was not given "
        f"(its rejections are told once a minute per reason; those before: {earlier})",
    )
    assert _assignments(fleet, "triage-llm") == placed
    replicas = fleet.api.get("/api/v1/replicas", params={"limit": 500}).json()["items"]
    assert "forged-1" not in {r.get("name") or r.get("replica_id") for r in replicas}
    assert len(fleet.api.get("/api/v1/instances").json()["items"]) == instances
