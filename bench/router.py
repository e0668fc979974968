"""Router bench: gpufleet's router next to vllm-router (PyPI, Rust) on the same engine-sim
backends, in the same run. Targets (DESIGN.md): added latency at concurrency 1 ≤ 1.2× vllm-router's;
a killed replica → 0 failed requests; a hung (SIGSTOPped) replica ejected ≤ 2 s with ≤ 0.5 %
failed. Throughput at concurrency 64 is reported for both. vllm-router is pip-installed into
its own venv under ~/.cache/gpufleet/bench/ on first use.
The last line printed is the headline: the figure, the peer or bound, the target, PASS or FAIL
(bench/support/headline.py); the exit status is non-zero on FAIL.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.support.headline import verdict
from workloadplane.router.upstream import UpstreamError, UpstreamPool
from workloadplane.runtime.process import free_port

VLLM_ROUTER = "vllm-router==0.1.17"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpufleet" / "bench"
BODY = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 4, "ignore_eos": True}).encode()  # fmt: skip
HEADERS = [(b"content-type", b"application/json")]


def vllm_router_bin() -> str:
    venv = CACHE / VLLM_ROUTER.replace("==", "-")
    exe = venv / "bin" / "vllm-router"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", VLLM_ROUTER],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return str(exe)


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


async def wait_up(port: int, path: str = "/health", timeout: float = 60) -> None:
    pool = UpstreamPool("127.0.0.1", port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            resp = await pool.request("GET", path, head_timeout=1)
            await resp.read()
            if resp.status == 200:
                pool.close()
                return
        except UpstreamError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"nothing healthy on port {port}")


def sims(n: int, tokens_per_s: float = 2000) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    ports = [free_port() for _ in range(n)]
    procs = [spawn([sys.executable, "-m", "workloadplane.enginesim", "--port", str(p), "--model",
                    "chat", "--tokens-per-s", str(tokens_per_s)]) for p in ports]  # fmt: skip
    return procs, ports


def routers(ports: list[int]) -> tuple[list[subprocess.Popen[bytes]], int, int]:
    ours, theirs = free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [
        spawn([sys.executable, "-m", "workloadplane.router", "--port", str(ours),
               *[a for u in urls for a in ("--replica", f"chat={u}")]]),
        spawn([vllm_router_bin(), "--port", str(theirs), "--worker-urls", *urls,
               "--policy", "round_robin", "--log-level", "error"]),
    ]  # fmt: skip
    return procs, ours, theirs


@dataclass
class Load:
    ok: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    fault_at: float = math.inf
    """perf_counter() of the fault (a fault run sets it): the failure share counts only the
    requests that ended after it, not the calm before."""
    ok_after: int = 0
    failed_after: int = 0


async def load(
    port: int, concurrency: int, seconds: float, timeout: float = 10, out: Load | None = None
) -> Load:
    pool = UpstreamPool("127.0.0.1", port)
    out = Load() if out is None else out
    started = time.perf_counter()
    end = started + seconds

    async def worker() -> None:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                resp = await asyncio.wait_for(pool.request("POST", "/v1/chat/completions",
                                                           HEADERS, BODY), timeout)  # fmt: skip
                await asyncio.wait_for(resp.read(), timeout)
                resp.release()
                ok = resp.status == 200
            except (UpstreamError, TimeoutError):
                ok = False
            ended = time.perf_counter()
            if ok:
                out.ok += 1
                out.latencies.append(ended - t0)
            else:
                out.failed += 1
            if ended >= out.fault_at:
                out.ok_after += ok
                out.failed_after += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.seconds = time.perf_counter() - started
    pool.close()
    return out


async def latency_c1(
    direct: list[int], routers: dict[str, int], rounds: int = 1000
) -> tuple[float, dict[str, float]]:
    """At concurrency 1 on keep-alive connections, one request to each target per round (the
    order rotating each round), 50 rounds of warm-up. ``direct`` takes the routers' engines
    in turn (as their round robin does), so no engine's own speed favours either side.
    Returns the p50 of direct and, per router, the median of its time minus direct's in the
    same round (paired: the machine's drift hits both sides of each difference alike)."""
    pools = [("direct", UpstreamPool("127.0.0.1", direct[0]))]
    pools += [(k, UpstreamPool("127.0.0.1", p)) for k, p in routers.items()]
    engines = [pools[0][1]] + [UpstreamPool("127.0.0.1", p) for p in direct[1:]]
    direct_s: list[float] = []
    added: dict[str, list[float]] = {k: [] for k in routers}
    for i in range(rounds + 50):
        shift = i % len(pools)
        took: dict[str, float] = {}
        for name, pool in pools[shift:] + pools[:shift]:
            if name == "direct":
                pool = engines[i % len(engines)]
            t0 = time.perf_counter()
            resp = await pool.request("POST", "/v1/chat/completions", HEADERS, BODY)
            body = await resp.read()
            resp.release()
            if resp.status != 200:  # a fast error is no latency figure
                raise SystemExit(f"{name} answered {resp.status}: {body[:200]!r}")
            took[name] = time.perf_counter() - t0
        if i >= 50:  # warm-up
            direct_s.append(took["direct"])
            for k in added:
                added[k].append(took[k] - took["direct"])
    for pool in [p for _, p in pools] + engines[1:]:
        pool.close()
    return statistics.median(direct_s), {k: statistics.median(v) for k, v in added.items()}


EJECTED_VICTIM = re.compile(r'^gpufleet_router_ejections_total\{[^}]*replica="chat-0"', re.M)


async def fault_run(router_port: int, victim: subprocess.Popen[bytes], sig: signal.Signals,
                    scrape_port: int | None) -> tuple[Load, float | None]:  # fmt: skip
    """32 concurrent clients for 6 s; ``sig`` hits a replica after 2 s. For our router also
    the time from SIGSTOP to the ejection showing in /metrics."""
    counted = Load()
    task = asyncio.create_task(load(router_port, 32, 6.0, out=counted))
    await asyncio.sleep(2.0)
    os.killpg(victim.pid, sig)
    counted.fault_at = time.perf_counter()
    t0 = time.monotonic()
    ejected_after = None
    if scrape_port is not None:
        pool = UpstreamPool("127.0.0.1", scrape_port)
        while time.monotonic() - t0 < 5:
            resp = await pool.request("GET", "/metrics")
            text = (await resp.read()).decode()
            resp.release()
            if EJECTED_VICTIM.search(text):  # the killed or hung replica, sim 0
                ejected_after = time.monotonic() - t0
                break
            await asyncio.sleep(0.02)
        pool.close()
    return await task, ejected_after


async def scenario(kind: str) -> dict[str, tuple[Load, float | None]]:
    """Fresh backends and routers per router under test, so one's fault can't hit the other."""
    out: dict[str, tuple[Load, float | None]] = {}
    for who in ("gpufleet", "vllm-router"):
        sim_procs, ports = sims(3)
        router_procs, ours, theirs = routers(ports)
        try:
            for p in [*ports, ours]:
                await wait_up(p)
            await wait_up(theirs, "/v1/models")
            port = ours if who == "gpufleet" else theirs
            sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
            out[who] = await fault_run(port, sim_procs[0], sig, ours if who == "gpufleet" else None)
        finally:
            stop(router_procs + sim_procs)
    return out


def pct(load: Load) -> float:
    """Failed share (%) of the requests that ended after the fault (of all, without one);
    100 when none did: nothing measured is no pass."""
    ok, failed = (load.ok_after, load.failed_after) if math.isfinite(load.fault_at) else (
        load.ok, load.failed)  # fmt: skip
    total = ok + failed
    return 100.0 * failed / total if total else 100.0


async def main() -> int:
    sim_procs, ports = sims(2)
    router_procs, ours, theirs = routers(ports)
    try:
        for p in [*ports, ours]:
            await wait_up(p)
        await wait_up(theirs, "/v1/models")
        p50, added = await latency_c1(ports, {"gpufleet": ours, "vllm-router": theirs})
        added_ours, added_theirs = added["gpufleet"] * 1000, added["vllm-router"] * 1000
        print(f"concurrency 1: direct p50 {p50 * 1000:.3f} ms; added (median of paired "
              f"differences): gpufleet {added_ours:.3f} ms, vllm-router {added_theirs:.3f} ms")  # fmt: skip
        thr: dict[str, Load] = {}
        for name, port in (("gpufleet", ours), ("vllm-router", theirs)):
            await load(port, 64, 1.0)  # warm-up: 64 connections opened
            thr[name] = await load(port, 64, 5.0)
        for name, res in thr.items():
            print(f"concurrency 64: {name} {res.ok / res.seconds:.0f} req/s, "
                  f"{res.failed} failed")  # fmt: skip
    finally:
        stop(router_procs + sim_procs)
    killed = await scenario("kill")
    hung = await scenario("hang")
    for label, res in (("killed replica", killed), ("hung replica", hung)):
        for name, (ld, ej) in res.items():
            extra = f", ejected after {ej:.2f} s" if ej is not None else ""
            print(
                f"{label}: {name} {ld.failed_after}/{ld.ok_after + ld.failed_after} failed after "
                f"the fault ({pct(ld):.2f} %; {ld.failed}/{ld.ok + ld.failed} over the run){extra}"
            )
    ratio = added_ours / added_theirs if added_theirs > 0 else float("inf")
    kill_failed = killed["gpufleet"][0].failed
    hung_load, ejected = hung["gpufleet"]
    checks = [ratio <= 1.2, kill_failed == 0, ejected is not None and ejected <= 2.0,
              pct(hung_load) <= 0.5]  # fmt: skip
    thr_ours, thr_theirs = (thr[n].ok / thr[n].seconds for n in ("gpufleet", "vllm-router"))
    print(f"HEADLINE router: added latency {added_ours:.3f} ms vs vllm-router {added_theirs:.3f} ms "
          f"({ratio:.2f}x, target <=1.2x); c64 {thr_ours:.0f} vs {thr_theirs:.0f} req/s; killed "
          f"replica {kill_failed} failed (target 0, vllm-router {killed['vllm-router'][0].failed}); "
          f"hung replica ejected in {ejected if ejected is not None else float('nan'):.2f} s, "
          f"{pct(hung_load):.2f} % failed (target <=2 s, <=0.5 %; vllm-router "
          f"{pct(hung['vllm-router'][0]):.2f} %) — {verdict(all(checks))}")  # fmt: skip
    return 0 if all(checks) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
