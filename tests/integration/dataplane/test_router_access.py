"""Who may use a plane, and who goes first when it is busy: API keys and priority tiers."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.dataplane.conftest import make_sim_deployment, running_plane
from tests.integration.dataplane.test_router_enginesim import chat
from workloadplane.router.core import RouterConfig
from workloadplane.router.keys import hash_key
from workloadplane.runtime.templates import enginesim_template

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def _until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_api_keys_gate_the_plane_and_a_higher_tier_overtakes_the_queue(tmp_path):
    config = RouterConfig(
        api_keys={hash_key("k-gold"): 0, hash_key("k-batch"): 2}, concurrency_override=1
    )
    async with running_plane(tmp_path, enginesim_template(), router_config=config) as plane:
        await plane.apply(make_sim_deployment(replicas=1, engine_args=["--tokens-per-s", "40"]))
        await plane.wait_ready("chat", 1)
        url = f"{plane.url}/v1/chat/completions"
        gold, batch = {"Authorization": "Bearer k-gold"}, {"Authorization": "Bearer k-batch"}
        async with httpx.AsyncClient(timeout=30) as client:
            missing = await client.post(url, json=chat())
            wrong = await client.post(url, json=chat(), headers={"Authorization": "Bearer nope"})
            models = f"{plane.url}/v1/models"
            unlisted = await client.get(models)  # as vLLM's --api-key guards all of /v1
            for r in (missing, wrong, unlisted):
                assert r.status_code == 401
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert r.headers["x-request-id"]
            listed = await client.get(models, headers=gold)
            assert [m["id"] for m in listed.json()["data"]] == ["chat"]

            finished: list[str] = []

            async def send(name: str, headers: dict[str, str], tokens: int) -> None:
                r = await client.post(url, json=chat(max_tokens=tokens), headers=headers)
                assert r.status_code == 200, r.text
                finished.append(name)

            busy = asyncio.create_task(send("busy", batch, 40))  # holds the only slot ~1 s
            await _until(lambda: plane.router.load("chat") == (1, 0), 10, "the slot to fill")
            low = asyncio.create_task(send("batch", batch, 4))
            await _until(lambda: plane.router.load("chat")[1] == 1, 10, "batch to queue")
            high = asyncio.create_task(send("gold", gold, 4))
            await _until(lambda: plane.router.load("chat")[1] == 2, 10, "gold to queue")
            await asyncio.gather(busy, low, high)
        assert finished == ["busy", "gold", "batch"]  # arrived last, served first


async def test_a_header_may_lower_a_keys_tier_but_never_raise_it(tmp_path):
    config = RouterConfig(api_keys={hash_key("k-batch"): 2}, concurrency_override=1)
    async with running_plane(tmp_path, enginesim_template(), router_config=config) as plane:
        await plane.apply(make_sim_deployment(replicas=1, engine_args=["--tokens-per-s", "40"]))
        await plane.wait_ready("chat", 1)
        url = f"{plane.url}/v1/chat/completions"
        batch = {"Authorization": "Bearer k-batch"}
        finished: list[str] = []
        async with httpx.AsyncClient(timeout=30) as client:

            async def send(name: str, headers: dict[str, str], tokens: int) -> None:
                r = await client.post(url, json=chat(max_tokens=tokens), headers=headers)
                assert r.status_code == 200, r.text
                finished.append(name)

            busy = asyncio.create_task(send("busy", batch, 40))
            await _until(lambda: plane.router.load("chat") == (1, 0), 10, "the slot to fill")
            first = asyncio.create_task(send("first", batch, 4))
            await _until(lambda: plane.router.load("chat")[1] == 1, 10, "first to queue")
            cheeky = asyncio.create_task(send("cheeky", {**batch, "X-Priority": "0"}, 4))
            await _until(lambda: plane.router.load("chat")[1] == 2, 10, "cheeky to queue")
            await asyncio.gather(busy, first, cheeky)
        assert finished == ["busy", "first", "cheeky"]  # FIFO in its own tier: no jump
