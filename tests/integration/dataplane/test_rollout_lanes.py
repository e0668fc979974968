"""A rollout lane on a real plane (issue 18): the agent runs a lane's replicas as engine-sim
processes that answer the deployment's own model name; the router sends the lane its share
of the deployment's requests, sticky per session, counts each side's outcomes, and the agent
reports them in its heartbeat. Promoting or rolling back is the control plane's business:
here the plane only has to follow the desired state it is given."""

from __future__ import annotations

import asyncio
import collections
import statistics
import time

import httpx
import pytest

from controlplane.contracts import DesiredState
from tests.integration.dataplane.conftest import Plane, make_sim_deployment

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_a_lane_serves_its_share_under_the_deployments_name(sim_plane: Plane):
    stable = make_sim_deployment("chat", 1)
    lane = make_sim_deployment("chat--r2", 1).model_copy(
        update={"serves": "chat", "traffic_share": 0.3}
    )
    lane = lane.model_copy(update={"spec": lane.spec.model_copy(update={"revision": "r2"})})
    await sim_plane.apply(stable, lane)
    await sim_plane.wait_ready("chat", 1)
    await sim_plane.wait_ready("chat--r2", 1)
    async with httpx.AsyncClient(base_url=sim_plane.url, timeout=20) as client:
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["chat"]  # the lane is no model of its own

        async def ask(user: str) -> dict:
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2, "user": user}  # fmt: skip
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            return answer.json()

        answers = await asyncio.gather(*(ask(f"u{i}") for i in range(120)))
        assert {a["model"] for a in answers} == {"chat"}  # the lane answers as "chat"
        lane_count = sim_plane.router.outcomes("chat--r2")
        stable_count = sim_plane.router.outcomes("chat")
        assert lane_count is not None and stable_count is not None
        assert lane_count.requests + stable_count.requests == 120
        assert 18 <= lane_count.requests <= 54, (lane_count.requests, stable_count.requests)
        assert lane_count.errors == stable_count.errors == 0
        # a session stays where it is: the same users again go to the same sides
        before = lane_count.requests
        await asyncio.gather(*(ask(f"u{i}") for i in range(120)))
        after = sim_plane.router.outcomes("chat--r2")
        assert after is not None and after.requests - before == before
        replicas = await sim_plane.runtime.list_replicas()
        assert collections.Counter(r.deployment for r in replicas) == {"chat": 1, "chat--r2": 1}
        observed = await sim_plane.agent.observed_state()
        reported = {d.name: d.outcomes for d in observed.deployments}
        assert reported["chat--r2"] is not None and reported["chat--r2"].requests == 2 * before
    # promoted: the deployment is now revision r2 and the lane retired (else a lane that had
    # traffic would be kept through the disappearance grace). The lane's ready replica joins
    # the deployment as it is — the same process, no new start — and r1's replica drains
    lane_id = next(r.replica_id for r in replicas if r.deployment == "chat--r2")
    lane_pid = sim_plane.pid(lane_id)
    promoted = stable.model_copy(update={"spec": lane.spec})
    sim_plane.generation += 1
    await sim_plane.agent.on_desired(DesiredState(cluster="test", generation=sim_plane.generation,
                                                  deployments=[promoted], retired=["chat--r2"]))  # fmt: skip
    async with asyncio.timeout(30):
        while {(r.replica_id, r.deployment) for r in await sim_plane.runtime.list_replicas()} != {
            (lane_id, "chat")
        }:
            await asyncio.sleep(0.05)
    assert sim_plane.pid(lane_id) == lane_pid
    async with httpx.AsyncClient(base_url=sim_plane.url, timeout=20) as client:
        answer = await client.post("/v1/chat/completions", json={
            "model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["model"] == "chat"


async def test_a_shadow_lane_gets_copies_and_never_changes_the_users_answers(sim_plane: Plane):
    """A shadow that fails half its requests (engine-sim --error-rate 0.5) and is 40x
    slower: the user gets every answer from the stable revision, at the stable revision's
    speed, and the shadow's outcomes are counted beside them."""
    stable = make_sim_deployment("chat", 1)
    shadow = make_sim_deployment(
        "chat--r3", 1, engine_args=["--tokens-per-s", "5", "--error-rate", "0.5"]
    ).model_copy(update={"serves": "chat", "traffic_share": 1.0, "mirror": True})
    await sim_plane.apply(stable, shadow)
    await sim_plane.wait_ready("chat", 1)
    await sim_plane.wait_ready("chat--r3", 1)
    async with httpx.AsyncClient(base_url=sim_plane.url, timeout=20) as client:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8, "ignore_eos": True}  # fmt: skip
        answers, took = [], []
        for _ in range(20):
            began = time.perf_counter()
            answers.append(await client.post("/v1/chat/completions", json=body))
            took.append(time.perf_counter() - began)
    assert [a.status_code for a in answers] == [200] * 20
    # 8 tokens: ~0.05 s at the stable revision's 200 tokens/s, 1.6 s at the shadow's 5
    assert statistics.median(took) < 0.8, took
    assert all(a.json()["usage"]["completion_tokens"] == 8 for a in answers)
    async with asyncio.timeout(30):  # the copies finish on their own time
        while (o := sim_plane.router.outcomes("chat--r3")) is None or o.requests < 20:
            await asyncio.sleep(0.05)
    copies, served = sim_plane.router.outcomes("chat--r3"), sim_plane.router.outcomes("chat")
    assert copies is not None and served is not None
    assert copies.requests == 20 and 0 < copies.errors < 20
    assert (served.requests, served.errors) == (20, 0)
