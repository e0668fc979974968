"""Issue 12 item 6 against the running `up` fleet: a plane that goes silent does not get
its deployment moved where it cannot run (use1-a's reserved pool is 16 GPUs in the
inventory, its agent has 8 and triage-llm uses them all), and once the plane is back the
deployment is placed and served again."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx

from tests.integration.faults.conftest import Fleet
from tests.integration.test_up import _wait_until

DEPLOYMENT = "batch-summarizer"  # 1 GPU, spot allowed: the one re-placement can move


def _placed_on(fleet: Fleet, deployment: str) -> set[str]:
    placement = fleet.api.get("/api/v1/placement").json()
    return {
        a["cluster"]
        for a in placement["assignments"]
        if a["deployment"] == deployment and a["replicas"] > 0
    }


def _state(fleet: Fleet, cluster: str) -> str:
    for c in fleet.api.get("/api/v1/clusters").json()["items"]:
        if c["name"] == cluster:
            return c["status"]["state"]
    raise AssertionError(f"no cluster {cluster}")


def _answers(fleet: Fleet, cluster: str) -> bool:
    """One short completion through the cluster's router is answered 200 (a replica there
    starts from zero if it must: what a user would see)."""
    body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}  # fmt: skip
    with contextlib.suppress(httpx.HTTPError):
        url = fleet.router(cluster) + "/v1/chat/completions"
        return httpx.post(url, json=body, timeout=20).status_code == 200
    return False


def _only_where_it_runs(fleet: Fleet, away_from: str) -> bool:
    """Unplaced (no room anywhere), or answered by a plane it is placed on."""
    elsewhere = _placed_on(fleet, DEPLOYMENT) - {away_from}
    return not elsewhere or any(_answers(fleet, c) for c in elsewhere)


def test_a_dead_planes_deployment_goes_only_where_it_can_run_and_comes_back(fleet: Fleet):
    _wait_until(lambda: bool(_placed_on(fleet, DEPLOYMENT)), 60, f"{DEPLOYMENT} placed")
    _wait_until(lambda: any(_answers(fleet, c) for c in _placed_on(fleet, DEPLOYMENT)), 60,
                f"{DEPLOYMENT} served")  # fmt: skip
    home = min(_placed_on(fleet, DEPLOYMENT))
    print(f"{DEPLOYMENT} on {home}")
    agent = fleet.child(f"agent --cluster {home}")
    os.killpg(agent.pid, signal.SIGSTOP)
    try:
        _wait_until(lambda: _state(fleet, home) == "down", 60, f"{home} to be declared down")
        time.sleep(3)  # the re-plan that follows
        _wait_until(
            lambda: _only_where_it_runs(fleet, home),
            60,
            f"{DEPLOYMENT} to be unplaced or served where it is placed (not stuck where its "
            f"plane has no GPU for it): placed on {_placed_on(fleet, DEPLOYMENT)}",
        )
        print(f"{home} down: {DEPLOYMENT} placed on {_placed_on(fleet, DEPLOYMENT)}")
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
    _wait_until(lambda: _state(fleet, home) == "healthy", 30, f"{home} healthy again")
    _wait_until(
        lambda: any(_answers(fleet, c) for c in _placed_on(fleet, DEPLOYMENT)),
        90,
        f"{DEPLOYMENT} placed and served again",
    )
    print(f"{home} back: {DEPLOYMENT} placed on {_placed_on(fleet, DEPLOYMENT)}")
