"""Local autoscaling end to end: the agent's autoscale loop (1 s ticks, real clock) with the
router and engine-sim replicas run by ProcessRuntime. A 3x load step is decided within 2 s;
a deployment at zero wakes at once and serves its first request after the cold start with no
error; a scale-down drains the replica the decision names and its request completes.

Waits are bounded (``asyncio.timeout``); the ticks run on the real clock because the
replicas do."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from controlplane.contracts import AutoscalingPolicy, DeploymentDesired, ReplicaQuota, RevisionSpec
from tests.integration.dataplane.conftest import Plane, running_plane
from workloadplane.autoscaler_loop import Autoscaler, ScaleEvent
from workloadplane.autoscaling import ScaleAction
from workloadplane.runtime.templates import enginesim_template

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def make_deployment(min_: int, max_: int, *, target: float = 4, window: float = 60,
                    delay: float = 60, idle: float | None = None,
                    engine_args: tuple[str, ...] = ()) -> DeploymentDesired:  # fmt: skip
    return DeploymentDesired(
        name="chat",
        spec=RevisionSpec(model_id="chat", revision="r1", engine_args=list(engine_args)),
        quota=ReplicaQuota(min=min_, max=max_),
        autoscaling=AutoscalingPolicy(
            window_seconds=window,
            scale_down_delay_seconds=delay,
            target_concurrency=target,
            scale_to_zero_idle_seconds=idle,
        ),
    )


def chat(max_tokens: int) -> dict:
    return {"model": "chat", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens, "ignore_eos": True}  # fmt: skip


@contextlib.asynccontextmanager
async def autoscaled_plane(tmp: Path) -> AsyncIterator[tuple[Plane, Autoscaler]]:
    async with running_plane(tmp, enginesim_template()) as plane:
        assert plane.agent.autoscaler is not None
        loop = asyncio.create_task(plane.agent.autoscale_loop(1.0))
        try:
            yield plane, plane.agent.autoscaler
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop


async def first_event(autoscaler: Autoscaler, action: ScaleAction, after: datetime,
                      timeout: float) -> ScaleEvent:  # fmt: skip
    async with asyncio.timeout(timeout):
        while True:
            for event in autoscaler.events:
                if event.action is action and event.time >= after:
                    return event
            await asyncio.sleep(0.02)


async def next_tick(autoscaler: Autoscaler) -> None:
    before = autoscaler.last.get("chat")
    async with asyncio.timeout(3):
        while autoscaler.last.get("chat") is before:
            await asyncio.sleep(0.005)


async def closed_loop(url: str, clients: int, body: dict, stop: asyncio.Event) -> list[int]:
    """``clients`` users, each sending its next request when the last one answers."""
    codes: list[int] = []
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def user() -> None:
            while not stop.is_set():
                try:
                    r = await client.post(f"{url}/v1/chat/completions", json=body)
                    codes.append(r.status_code)
                except httpx.HTTPError:
                    codes.append(-1)

        await asyncio.gather(*(user() for _ in range(clients)))
    return codes


async def test_a_3x_load_step_is_decided_within_2s(tmp_path: Path):
    async with autoscaled_plane(tmp_path) as (plane, autoscaler):
        await plane.apply(make_deployment(1, 4, engine_args=("--tokens-per-s", "20")))
        await plane.wait_ready("chat", 1)
        stop = asyncio.Event()
        body = chat(max_tokens=30)  # 1.5 s per request
        base = asyncio.create_task(closed_loop(plane.url, 4, body, stop))  # at the target
        for _ in range(3):  # a few ticks of steady load
            await next_tick(autoscaler)
        assert plane.agent.wanted["chat"] == 1
        await next_tick(autoscaler)  # step right after a tick: the worst case
        step_at = datetime.now(UTC)
        started = time.monotonic()
        step = asyncio.create_task(closed_loop(plane.url, 8, body, stop))  # 3x
        event = await first_event(autoscaler, ScaleAction.SCALE_UP, step_at, timeout=5)
        decided = (event.time - step_at).total_seconds()
        await plane.wait_ready("chat", 3, timeout=30)
        ready = time.monotonic() - started
        stop.set()
        codes = await base + await step
    print(f"3x step: scale-up decided after {decided:.2f}s, 3 replicas ready after {ready:.2f}s")
    # usually a panic straight to 3; on a loaded machine the stable window may see the step
    # first and go to 2 (then 3): either way it is a scale-up, decided in time
    assert event.from_replicas == 1
    assert event.to_replicas >= 2
    # The tick after the step sees the burst and a second look half a tick later confirms
    # it: 1.5 s at worst, which this is (two whole ticks would be 2 s); the target is 2 s,
    # the rest allows for ticks late on two loaded cores.
    assert decided <= 2.0, event
    assert set(codes) == {200}, sorted(set(codes))


async def test_scale_from_zero_wakes_at_once_and_fails_nothing(tmp_path: Path):
    cold_start = 2.0
    # a 2 s window: scale to zero waits for the window to be clear of load as well as idle
    deployment = make_deployment(0, 2, window=2, delay=2, idle=2, engine_args=(
        "--startup-delay", str(cold_start), "--refuse-during-startup"))  # fmt: skip
    async with autoscaled_plane(tmp_path) as (plane, autoscaler):
        await plane.apply(deployment)
        async with asyncio.timeout(5):
            while "chat" not in autoscaler.last:  # one tick has decided: stay at zero
                await asyncio.sleep(0.02)
        assert await plane.runtime.list_replicas() == []
        await next_tick(autoscaler)  # the next regular tick is a second away
        sent_at = datetime.now(UTC)
        sent = time.monotonic()
        async with httpx.AsyncClient(timeout=30) as client:

            async def one() -> tuple[int, float]:
                r = await client.post(f"{plane.url}/v1/chat/completions", json=chat(5))
                return r.status_code, time.monotonic() - sent

            answers = await asyncio.gather(*(one() for _ in range(6)))
        event = await first_event(autoscaler, ScaleAction.SCALE_UP, sent_at, timeout=1)
        woke = (event.time - sent_at).total_seconds()
        first = min(t for _, t in answers)
        # idle for 2 s: back to zero, the replica drained
        down = await first_event(autoscaler, ScaleAction.SCALE_DOWN, sent_at, timeout=10)
        async with asyncio.timeout(10):
            while await plane.runtime.list_replicas():
                await asyncio.sleep(0.05)
    print(f"from zero: decided after {woke * 1000:.0f} ms, first response after {first:.2f}s "
          f"(cold start {cold_start:g}s)")  # fmt: skip
    assert [code for code, _ in answers] == [200] * 6
    assert event.from_replicas == 0 and event.to_replicas in (1, 2)  # ceil(queued / 4)
    assert woke < 0.5  # woken by the queue, not by the next tick
    assert first >= cold_start  # held during the cold start, not failed
    assert down.to_replicas == 0 and "scale to zero" in down.reason


async def test_a_replica_with_requests_in_flight_is_drained_not_killed(tmp_path: Path):
    def deployment(min_: int) -> DeploymentDesired:
        return make_deployment(min_, 2, window=2, delay=2, engine_args=("--tokens-per-s", "20"))

    async with autoscaled_plane(tmp_path) as (plane, autoscaler):
        await plane.apply(deployment(min_=2))
        replicas = await plane.wait_ready("chat", 2)
        pids = {rid: plane.pid(rid) for rid in replicas}
        async with httpx.AsyncClient(timeout=60) as client:
            requests = [asyncio.create_task(client.post(f"{plane.url}/v1/chat/completions",
                                                        json=chat(200))) for _ in range(2)]  # fmt: skip
            async with asyncio.timeout(5):  # one 10 s request on each replica
                while [plane.router.replica_in_flight(r) for r in replicas] != [1, 1]:
                    await asyncio.sleep(0.02)
            lowered_at = datetime.now(UTC)
            await plane.apply(deployment(min_=1))  # load 2 / target 4: one replica is enough
            event = await first_event(autoscaler, ScaleAction.SCALE_DOWN, lowered_at, timeout=8)
            (victim,) = event.drain
            assert plane.router.replica_in_flight(victim) == 1, "its request already finished"
            assert plane.runtime.state(victim) == "draining"
            os.kill(pids[victim], 0)  # still running: drained, not killed
            answers = await asyncio.gather(*requests)
        done = time.monotonic()
        async with asyncio.timeout(15):  # then stopped, once its request is done
            while plane.runtime.state(victim) is not None:
                await asyncio.sleep(0.05)
        stopped_after = time.monotonic() - done
        (survivor,) = [r.replica_id for r in await plane.runtime.list_replicas()]
    print(f"drain: {victim} stopped {stopped_after:.2f}s after its request completed")
    assert (event.from_replicas, event.to_replicas) == (2, 1)
    assert survivor != victim and survivor in replicas  # reconcile removed no other replica
    for r in answers:
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200
