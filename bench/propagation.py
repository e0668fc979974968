"""Desired change → applied and acknowledged by the agent, next to bare NATS, same run.

Ours: control plane ``publish_desired`` (KV CAS) → agent process (watch, validate, fsync the
snapshot, reconcile, act on an in-memory runtime) → ``DesiredStateApplied`` over JetStream →
control-plane durable consumer. Peer: the same trip with nothing but nats-py — ``kv.put`` →
``kv.watch`` in another process → ``js.publish`` ack → durable consumer. The bare one-way
put→watch time is printed too. Samples alternate between the two paths.
Target: p99 ≤ 20 ms and ≤ 1.5× the bare round trip. Then: the highest update rate the agent
sustains without its backlog growing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controlplane.bus import (
    ReportConsumer,
    ensure_bus,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    publish_desired,
    render_server_config,
    write_server_config,
)
from controlplane.bus.desired import DesiredPublisher
from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    DesiredStateApplied,
    Fact,
    ObservedState,
    ReplicaQuota,
    RevisionSpec,
)
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port

CLUSTER = "bench"
BARE_BUCKET, BARE_STREAM, BARE_ACK = "bench_bare", "BENCH_BARE_ACKS", "bench.bare.ack"
TARGET_P99_MS, TARGET_RATIO = 20.0, 1.5
AGENT_FLAGS: list[str] = os.environ.get("BENCH_AGENT_FLAGS", "").split()


def desired(generation: int) -> DesiredState:
    return DesiredState(cluster=CLUSTER, generation=generation, deployments=[
        DeploymentDesired(name="chat", quota=ReplicaQuota(min=1 + generation % 3, max=4),
                          spec=RevisionSpec(model_id="meta-llama/Llama-3.1-8B", revision="r1",
                                            engine_args=["--max-model-len", "8192"]))])  # fmt: skip


class AckSink:
    """ObservedStateSink that wakes whoever waits for a generation's acknowledgement."""

    def __init__(self) -> None:
        self.acked = 0
        self.waiters: dict[int, asyncio.Future[float]] = {}

    async def record_observed(self, cluster: str, state: ObservedState, received_at: datetime):
        pass

    async def record_fact(self, cluster: str, fact: Fact, received_at: datetime) -> None:
        if isinstance(fact, DesiredStateApplied):
            self.acked = max(self.acked, fact.generation)
            waiter = self.waiters.pop(fact.generation, None)
            if waiter and not waiter.done():
                waiter.set_result(time.perf_counter())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def bare_watcher(url: str, user: str, password: str) -> None:
    """Child process of the bare path: watch the key, ack each update over JetStream."""
    nc = await nats.connect(url, user=user, password=password)
    js = nc.jetstream()
    kv = await js.key_value(BARE_BUCKET)
    watcher = await kv.watch("k")
    async for entry in watcher:
        if entry is None:
            continue
        t_recv = time.monotonic()
        await js.publish(BARE_ACK, json.dumps({"rev": entry.revision, "t": t_recv}).encode())


async def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def main(samples: int, rate_seconds: float) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    cp_creds, cl_creds = generate_controlplane_credentials(), generate_cluster_credentials(CLUSTER)
    port = free_port()
    conf = write_server_config(tmp / "nats.conf", render_server_config(
        controlplane=cp_creds, clusters={CLUSTER: cl_creds}, store_dir=tmp / "js", port=port))  # fmt: skip
    server = NatsServer(store_dir=tmp / "js", port=port, config_file=conf).start()
    url = server.url
    creds_file = tmp / "agent-creds.json"
    creds_file.write_text(cl_creds.model_dump_json())
    procs: list[subprocess.Popen[bytes]] = []
    nc = await nats.connect(url, **cp_creds.connect_options())
    try:
        js = nc.jetstream(timeout=2)
        kv = await ensure_bus(js)
        sink = AckSink()
        consumer = ReportConsumer(js, sink)
        await consumer.start()
        # bare path objects
        bare_kv = await js.create_key_value(bucket=BARE_BUCKET, history=1)
        await js.add_stream(StreamConfig(name=BARE_STREAM, subjects=[BARE_ACK]))
        bare_waiters: dict[int, asyncio.Future[tuple[float, float]]] = {}
        bare_early: dict[int, tuple[float, float]] = {}  # acks that beat put()'s return

        async def on_bare_ack(msg) -> None:
            body = json.loads(msg.data)
            got = (time.perf_counter(), body["t"])
            waiter = bare_waiters.pop(body["rev"], None)
            if waiter is None:
                bare_early[body["rev"]] = got
            elif not waiter.done():
                waiter.set_result(got)
            await msg.ack()

        await js.subscribe(BARE_ACK, durable="bare", stream=BARE_STREAM, cb=on_bare_ack,
                           manual_ack=True, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT))  # fmt: skip
        env = {**os.environ, "GPUFLEET_LOG_LEVEL": "WARNING"}
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        procs.append(subprocess.Popen([sys.executable, "-m", "workloadplane.agent",
            "--cluster", CLUSTER, "--nats-url", url, "--credentials-file", str(creds_file),
            "--state-dir", str(tmp / "agent"), "--heartbeat-interval", "1", *AGENT_FLAGS], env=env))  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, __file__, "--bare-watcher", url,
                                       "--user", cp_creds.user, "--password", cp_creds.password],
                                      env=env))  # fmt: skip

        generation = 0
        publisher = DesiredPublisher(kv)  # what the control plane's bus process uses

        async def ours() -> float:
            nonlocal generation
            generation += 1
            fut = asyncio.get_running_loop().create_future()
            sink.waiters[generation] = fut
            t0 = time.perf_counter()
            await publisher.publish(desired(generation))
            return (await asyncio.wait_for(fut, 5)) - t0

        async def bare() -> tuple[float, float]:
            fut = asyncio.get_running_loop().create_future()
            t0, m0 = time.perf_counter(), time.monotonic()
            rev = await bare_kv.put("k", desired(generation).model_dump_json().encode())
            if rev in bare_early:
                t_ack, t_recv = bare_early.pop(rev)
            else:
                bare_waiters[rev] = fut
                t_ack, t_recv = await asyncio.wait_for(fut, 5)
            return t_ack - t0, t_recv - m0

        # Warm up both paths (process start, imports, first consumers).
        await publish_desired(kv, desired(1))
        generation = 1
        await wait_for(lambda: sink.acked >= 1, 30, "the agent to acknowledge generation 1")
        for _ in range(20):
            await ours()
            await bare()
        ours_ms, bare_rt_ms, bare_ow_ms = [], [], []
        for _ in range(samples):
            ours_ms.append(await ours() * 1000)
            rt, ow = await bare()
            bare_rt_ms.append(rt * 1000)
            bare_ow_ms.append(ow * 1000)

        def line(name: str, v: list[float]) -> str:
            return (f"  {name:<42} p50 {statistics.median(v):6.2f} ms   p99 {pct(v, 99):6.2f} ms"
                    f"   max {max(v):6.2f} ms")  # fmt: skip

        flags = " ".join(AGENT_FLAGS) or "none: fsync on"
        print(f"propagation, {samples} samples each, loopback, agent in its own process "
              f"(extra agent flags: {flags})")  # fmt: skip
        print(line("gpufleet desired → applied → acknowledged", ours_ms))
        print(line("bare kv.put → watch → js ack (round trip)", bare_rt_ms))
        print(line("bare kv.put → watch (one way)", bare_ow_ms))

        # Sustained rate: paced publishing; backlog = published - acknowledged generations.
        sustained = 0
        for rate in (50, 100, 200, 400, 800):
            start_gen, lags = generation, []
            t_start = time.perf_counter()
            n = int(rate * rate_seconds)
            for i in range(n):
                generation += 1
                await publisher.publish(desired(generation))
                lags.append(generation - sink.acked)
                delay = t_start + (i + 1) / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            achieved = n / (time.perf_counter() - t_start)
            await wait_for(lambda g=generation: sink.acked >= g, 30, "the agent to catch up")
            half = len(lags) // 2
            first, second = max(lags[:half]), max(lags[half:])
            growing = second > max(first, 2) * 1.5 or achieved < rate * 0.9
            print(f"  rate {rate:4d}/s (achieved {achieved:6.1f}/s, {generation - start_gen} "
                  f"updates): max backlog {first} then {second} → "
                  f"{'growing' if growing else 'steady'}")  # fmt: skip
            if growing:
                break
            sustained = rate
        print(f"  sustained without backlog growth: {sustained} updates/s")

        p99, bare_p99 = pct(ours_ms, 99), pct(bare_rt_ms, 99)
        ratio = p99 / bare_p99
        ok = p99 <= TARGET_P99_MS and ratio <= TARGET_RATIO
        await consumer.stop()  # before the headline: a failure here is no PASS on screen
        print(f"HEADLINE propagation p99 {p99:.2f} ms (p50 {statistics.median(ours_ms):.2f}) vs "
              f"bare NATS put→watch→ack p99 {bare_p99:.2f} ms = {ratio:.2f}x; "
              f"target p99 <= {TARGET_P99_MS:.0f} ms and <= {TARGET_RATIO}x bare; "
              f"sustained {sustained}/s (reported, no target): "
              f"{'PASS' if ok else 'FAIL'}")  # fmt: skip
        return 0 if ok else 1
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.wait(5)
        await nc.close()
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--rate-seconds", type=float, default=2.0)
    parser.add_argument("--bare-watcher")
    parser.add_argument("--user")
    parser.add_argument("--password")
    args = parser.parse_args()
    if args.bare_watcher:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(bare_watcher(args.bare_watcher, args.user, args.password))
        raise SystemExit(0)
    raise SystemExit(asyncio.run(main(args.samples, args.rate_seconds)))
