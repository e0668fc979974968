"""The engine simulator as a process (uvicorn, as users run it), where its behaviour depends
on the HTTP server: a client that leaves, and the answer vLLM 0.32 gives."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.dataplane.conftest import until_healthy
from workloadplane.runtime.process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture
def engine() -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "workloadplane.enginesim", "--model", "chat",
            "--port", str(port), "--tokens-per-s", "20", "--max-model-len", "2048"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _running(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("vllm:num_requests_running is missing")


async def test_a_client_that_leaves_a_plain_request_frees_its_slot(engine: str) -> None:
    """vLLM aborts a request whose client disconnects (`with_cancellation`); the simulator
    kept generating a non-streamed answer nobody would read, and counted it as running."""
    await until_healthy(engine, 30)
    host, port = engine.removeprefix("http://").split(":")
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1000, "ignore_eos": True}).encode()  # fmt: skip
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    await writer.drain()
    async with httpx.AsyncClient() as client:
        async with asyncio.timeout(10):
            while _running((await client.get(f"{engine}/metrics")).text) < 1:
                await asyncio.sleep(0.05)
        writer.close()  # gone, 1,000 tokens at 20/s before it
        async with asyncio.timeout(5):
            while _running((await client.get(f"{engine}/metrics")).text) > 0:
                await asyncio.sleep(0.05)


async def test_max_tokens_beyond_what_the_context_has_left_is_cut_not_refused(
    engine: str,
) -> None:
    """vLLM 0.32 caps the answer at the context's room (`get_max_tokens`), finish "length"."""
    await until_healthy(engine, 30)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2048, "ignore_eos": True, "stream": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=5) as client:
        async with client.stream("POST", f"{engine}/v1/chat/completions", json=body) as answer:
            assert answer.status_code == 200
            async for line in answer.aiter_lines():  # the first token is enough
                if line.startswith("data: {"):
                    break
        over = await client.post(
            f"{engine}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4096}
        )
        assert over.status_code == 400 and "cannot be greater than max_model_len" in over.text
