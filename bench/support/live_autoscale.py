"""A live agent for bench/autoscale.py: one 3x load step against a real agent and its router.

``python bench/support/live_autoscale.py --agent DIR`` runs the workload plane in its own
process (Agent + ProcessRuntime with engine-sim replicas + the router on loopback + the
autoscale loop at 1 s ticks on the real clock), prints ``ready <router url>`` once one replica
serves, then one JSON line per scale decision the agent records (its ``ScaleEvent``, the
decision a ``ReplicasScaled`` fact reports). :func:`measure_step` drives it from the bench
process: a bounded closed-loop load at the target, then 3x at a random moment between ticks;
the decision time is the event's time minus the step's (one machine, one clock).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    DesiredState,
    ReplicaQuota,
    RevisionSpec,
)
from workloadplane.agent import Agent, ReplicaChanges
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.server import serve_router
from workloadplane.runtime.process import ProcessConfig, ProcessRuntime, free_port
from workloadplane.runtime.templates import enginesim_template
from workloadplane.state import DesiredStateStore

TARGET, BASE, MAX_TOKENS, TOKENS_PER_S = 4, 3, 30, 20  # 75 % of one replica; 1.5 s a request
NEED = 3  # replicas for 3 x BASE at TARGET


def deployment(window: float, delay: float) -> DeploymentDesired:
    return DeploymentDesired(
        name="chat",
        spec=RevisionSpec(model_id="chat", revision="r1",
                          engine_args=["--tokens-per-s", str(TOKENS_PER_S)]),
        quota=ReplicaQuota(min=1, max=4),
        autoscaling=AutoscalingPolicy(window_seconds=window, scale_down_delay_seconds=delay,
                                      target_concurrency=TARGET, scale_to_zero_idle_seconds=None),
    )  # fmt: skip


async def run_agent(tmp: Path, window: float, delay: float) -> None:
    router = Router(RouterConfig())
    changes = ReplicaChanges(router)
    runtime = ProcessRuntime(
        enginesim_template(),
        tmp / "runtime",
        config=ProcessConfig(health_interval_s=0.5, backoff_initial_s=0.2),
        watcher=changes,
        in_flight=router,
    )
    agent = Agent(
        "bench",
        runtime,
        DesiredStateStore(tmp / "state", fsync=False),
        router=router,
        changes=changes,
    )
    assert agent.autoscaler is not None
    port, stop = free_port(), asyncio.Event()
    tasks = [asyncio.create_task(serve_router(router, "127.0.0.1", port, stop)),
             asyncio.create_task(agent.reconcile_loop(0.5))]  # fmt: skip
    try:
        await agent.on_desired(DesiredState(cluster="bench", generation=1,
                                            deployments=[deployment(window, delay)]))  # fmt: skip
        async with asyncio.timeout(60):
            while not any(b.routable for b in router.backends.values()):
                await asyncio.sleep(0.05)
        tasks.append(asyncio.create_task(agent.autoscale_loop(1.0)))
        print(f"ready http://127.0.0.1:{port}", flush=True)
        seen = 0
        while True:
            events = list(agent.autoscaler.events)
            for e in events[seen:]:
                print(json.dumps({"time": e.time.isoformat(), "action": str(e.action),
                                  "from": e.from_replicas, "to": e.to_replicas,
                                  "panic": e.panic, "reason": e.reason}), flush=True)  # fmt: skip
            seen = len(events)
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runtime.close()


@dataclass(frozen=True)
class LiveStep:
    decided_after: float  # seconds from the step to the agent's scale-up decision; inf: none
    from_replicas: int
    to_replicas: int
    panic: bool
    reason: str
    full_after: float  # seconds to a decision for all the replicas 3x needs; inf: none
    failed: int  # requests not answered 200
    before: tuple[str, ...]  # decisions taken before the step (a fair run has none)


async def _closed_loop(url: str, clients: int, stop: asyncio.Event) -> list[int]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True}  # fmt: skip
    codes: list[int] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as c:

        async def user() -> None:
            while not stop.is_set():
                try:
                    codes.append(
                        (await c.post(f"{url}/v1/chat/completions", json=body)).status_code
                    )
                except httpx.HTTPError:
                    codes.append(-1)

        await asyncio.gather(*(user() for _ in range(clients)))
    return codes


async def measure_step(tmp: Path, window: float, delay: float, steady_s: float) -> LiveStep:
    """Start a live agent, hold BASE concurrent requests for ``steady_s``, step to 3x; wait
    at most 10 s for the scale-up."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--agent", str(tmp), "--window", str(window),
        "--delay", str(delay), stdout=asyncio.subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    stdout = proc.stdout
    stop, events = asyncio.Event(), []

    async def read_events() -> None:
        while line := await stdout.readline():
            events.append(json.loads(line))

    try:
        async with asyncio.timeout(90):
            line = (await stdout.readline()).decode().split()
        if line[:1] != ["ready"]:
            raise RuntimeError(f"live agent did not start: {line}")
        reader = asyncio.create_task(read_events())
        base = asyncio.create_task(_closed_loop(line[1], BASE, stop))
        await asyncio.sleep(steady_s)
        step_at = datetime.now(UTC)
        step = asyncio.create_task(_closed_loop(line[1], 2 * BASE, stop))  # 3x in all

        def scale_up(to: int = 0) -> dict | None:
            return next((e for e in events if e["action"] == "scale_up" and e["to"] >= to
                         and datetime.fromisoformat(e["time"]) >= step_at), None)  # fmt: skip

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while scale_up(NEED) is None:
                    await asyncio.sleep(0.05)
        stop.set()
        codes = await base + await step
        reader.cancel()
    finally:
        stop.set()
        # SIGINT, not SIGTERM: asyncio.run cancels the agent, whose `finally` stops its
        # engine-sim replicas (SIGTERM killed it at once and left them running)
        proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(30):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
    before = tuple(f"{e['time']} {e['from']}->{e['to']}: {e['reason']}" for e in events
                   if datetime.fromisoformat(e["time"]) < step_at)  # fmt: skip
    failed = sum(1 for c in codes if c != 200)

    def after(e: dict | None) -> float:
        return (
            math.inf if e is None else (datetime.fromisoformat(e["time"]) - step_at).total_seconds()
        )

    event = scale_up()
    if event is None:
        return LiveStep(math.inf, 0, 0, False, "", math.inf, failed, before)
    return LiveStep(after(event), event["from"], event["to"], event["panic"], event["reason"],
                    after(scale_up(NEED)), failed, before)  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", type=Path, required=True)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--delay", type=float, default=60.0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_agent(args.agent, args.window, args.delay))
