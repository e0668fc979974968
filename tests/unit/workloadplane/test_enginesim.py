"""Engine simulator: OpenAI routes, SSE format, errors, batching and KV budget, in process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import httpx
import httpx2
import pytest
import uvicorn
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from workloadplane.enginesim import EngineConfig, Simulator

FAST = {"tokens_per_s": 2000.0}


def make_sim(**overrides: object) -> Simulator:
    knobs: dict[str, object] = {"model": "tiny", **FAST}
    knobs.update(overrides)
    return Simulator(EngineConfig(**knobs))  # type: ignore[arg-type]


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    s = make_sim()
    yield s
    await s.engine.stop()


def client_for(sim: Simulator) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=sim.app), base_url="http://sim")


def openai_for(sim: Simulator) -> AsyncOpenAI:
    # The openai SDK is built on httpx2 (its fork of httpx); give it an in-process transport.
    transport = httpx2.ASGITransport(app=sim.app)
    http = httpx2.AsyncClient(transport=transport, base_url="http://sim")
    return AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http)


def sse_events(text: str) -> list[str]:
    assert text.endswith("data: [DONE]\n\n")
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


async def test_openai_sdk_chat_non_streaming(sim: Simulator) -> None:
    client = openai_for(sim)
    reply = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens <= 8
    again = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    assert again.choices[0].message.content == reply.choices[0].message.content  # deterministic


async def test_openai_sdk_chat_streaming_with_usage(sim: Simulator) -> None:
    client = openai_for(sim)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


async def test_openai_sdk_completion_and_embeddings(sim: Simulator) -> None:
    client = openai_for(sim)
    done = await client.completions.create(model="tiny", prompt="Once upon", max_tokens=5)
    assert done.object == "text_completion"
    assert done.choices[0].finish_reason in ("length", "stop")
    emb = await client.embeddings.create(model="tiny", input=["a", "b"])  # base64 by default
    assert len(emb.data) == 2
    assert len(emb.data[0].embedding) == 64


async def test_completion_stream_is_vllm_shaped(sim: Simulator) -> None:
    async with client_for(sim) as http:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "stream": True}
        body["stream_options"] = {"include_usage": True}
        body["ignore_eos"] = True
        response = await http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, None, "length"]
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["completion_tokens"] == 4


async def test_stop_string_ends_with_stop_reason(sim: Simulator) -> None:
    async with client_for(sim) as http:
        free = await http.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "abc", "max_tokens": 30, "ignore_eos": True},
        )
        words = free.json()["choices"][0]["text"].split()
        stop = words[3]
        cut = await http.post(
            "/v1/completions",
            json={
                "model": "tiny",
                "prompt": "abc",
                "max_tokens": 30,
                "ignore_eos": True,
                "stop": [f" {stop}"],
            },
        )
    choice = cut.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == f" {stop}"
    assert f" {stop}" not in choice["text"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, "body"),
        (b"[]", 400, "body"),
        (json.dumps({"model": "tiny"}).encode(), 400, "body.messages"),
        (json.dumps({"model": "tiny", "messages": []}).encode(), 400, None),
        (
            json.dumps({"model": "tiny", "messages": [{"role": "user"}], "max_tokens": 0}).encode(),
            400,
            "max_tokens",
        ),
        (
            json.dumps(
                {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}
            ).encode(),
            400,
            "n",
        ),
        (
            json.dumps(
                {"model": "tiny", "messages": [{"role": "user"}], "max_tokens": 5000}
            ).encode(),
            400,
            "max_tokens",
        ),
        (
            json.dumps(
                {
                    "model": "tiny",
                    "messages": [{"role": "user"}],
                    "stream_options": {"include_usage": True},
                }
            ).encode(),
            400,
            "stream_options",
        ),
        (json.dumps({"model": "other", "messages": [{"role": "user"}]}).encode(), 404, "model"),
    ],
)
async def test_bad_input_gets_openai_shaped_error(
    sim: Simulator, body: bytes, status: int, param: str | None
) -> None:
    async with client_for(sim) as http:
        response = await http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["message"]
    if param is not None:
        assert error["param"] == param


async def test_openai_sdk_raises_typed_errors(sim: Simulator) -> None:
    client = openai_for(sim)
    with pytest.raises(NotFoundError):
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(BadRequestError, match="cannot be greater than max_model_len"):
        await client.completions.create(model="tiny", prompt="x", max_tokens=4096)


async def test_models_and_health() -> None:
    sim = make_sim(startup_delay_s=3600.0)
    async with client_for(sim) as http:
        assert (await http.get("/health")).status_code == 503
        starting = await http.get("/v1/models")
        assert starting.status_code == 503
        sim.ready_at = 0.0  # the cold start is over
        assert (await http.get("/health")).status_code == 200
        models = (await http.get("/v1/models")).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "tiny"
    assert models["data"][0]["max_model_len"] == 2048
    await sim.engine.stop()


async def test_continuous_batching_caps_running_and_queues_the_rest() -> None:
    # 20 tokens at 40 tokens/s: each pair runs 0.5 s, long enough to see all 5 admitted
    # however slowly a loaded machine delivers the requests to the engine.
    sim = make_sim(tokens_per_s=40.0, max_num_seqs=2)
    async with client_for(sim) as http:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 20, "ignore_eos": True}
        tasks = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in range(5)]
        deadline = asyncio.get_running_loop().time() + 5.0
        while (len(sim.engine.running), len(sim.engine.waiting)) != (2, 3):
            assert asyncio.get_running_loop().time() < deadline, (
                f"never 2 running and 3 waiting: {len(sim.engine.running)} running, "
                f"{len(sim.engine.waiting)} waiting"
            )
            await asyncio.sleep(0.005)
        metrics = (await http.get("/metrics")).text
        assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0' in _sorted(metrics)
        assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0' in _sorted(metrics)
        responses = await asyncio.gather(*tasks)
    assert all(r.status_code == 200 for r in responses)
    assert all(r.json()["usage"]["completion_tokens"] == 20 for r in responses)
    await sim.engine.stop()


async def test_kv_budget_limits_admission_and_preempts() -> None:
    # 4 blocks of 4 tokens: a 5-token prompt takes 2 blocks, so two fit, then they grow.
    sim = make_sim(tokens_per_s=500.0, kv_blocks=4, block_size=4, max_model_len=16)
    async with client_for(sim) as http:
        body = {"model": "tiny", "prompt": "x" * 20, "max_tokens": 6, "ignore_eos": True}
        tasks = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert sim.engine.used_blocks <= 4
        responses = await asyncio.gather(*tasks)
        metrics = (await http.get("/metrics")).text
    assert all(r.json()["usage"]["completion_tokens"] == 6 for r in responses)
    assert _value(metrics, "vllm:num_preemptions_total") > 0
    assert _value(metrics, "vllm:kv_cache_usage_perc") == 0.0
    await sim.engine.stop()


async def test_token_rate_sets_the_pace() -> None:
    sim = make_sim(tokens_per_s=100.0)
    async with client_for(sim) as http:
        loop = asyncio.get_running_loop()
        start = loop.time()
        body = {"model": "tiny", "prompt": "x", "max_tokens": 20, "ignore_eos": True}
        await http.post("/v1/completions", json=body)
        elapsed = loop.time() - start
    assert 0.15 <= elapsed < 1.0  # 20 steps at 10 ms
    await sim.engine.stop()


async def serve(sim: Simulator) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    """Run the app on a free loopback port (real sockets: disconnects are real)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(sim.app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_client_disconnect_aborts_the_stream() -> None:
    slow = make_sim(tokens_per_s=50.0)
    server, task, url = await serve(slow)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            body = {"model": "tiny", "prompt": "x", "max_tokens": 500, "stream": True}
            body["ignore_eos"] = True
            async with http.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        break
            for _ in range(100):
                if not slow.engine.running:
                    break
                await asyncio.sleep(0.01)
            metrics = (await http.get("/metrics")).text
    finally:
        server.should_exit = True
        await task
        await slow.engine.stop()
    assert not slow.engine.running
    assert 'engine="0",finished_reason="abort",model_name="tiny"} 1.0' in _sorted(metrics)


def test_cli_serves_after_its_startup_delay() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["--port", str(port), "--model", "cli", "--tokens-per-s", "1000"]
    args += ["--startup-delay", "1.5", "--max-num-seqs", "4", "--kv-blocks", "256"]
    proc = subprocess.Popen([sys.executable, "-m", "workloadplane.enginesim", *args])
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and 200 not in seen:
            assert proc.poll() is None, "engine-sim exited"
            with contextlib.suppress(httpx.TransportError):
                seen.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code)
            time.sleep(0.05)
        assert seen[0] == 503
        assert seen[-1] == 200
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "cli", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["finish_reason"] == "stop"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _sorted(metrics: str) -> str:
    """Exposition with labels in name order, so assertions do not depend on label order."""
    out = []
    for line in metrics.splitlines():
        if "{" in line and not line.startswith("#"):
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            parts = sorted(labels.split(","))
            line = f"{name}{{{','.join(parts)}}} {value}"
        out.append(line)
    return "\n".join(out)


def _value(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_config_refuses_a_kv_cache_smaller_than_one_sequence() -> None:
    with pytest.raises(ValueError, match="raise kv_blocks or lower max_model_len"):
        EngineConfig(kv_blocks=10, block_size=16, max_model_len=2048)


async def test_a_request_the_next_step_admits_never_shows_as_waiting() -> None:
    # vLLM takes its scheduler stats after each step's admission: an autoscaler scraping
    # between a request's arrival and the next step must not see a waiting queue.
    sim = make_sim(tokens_per_s=5.0)  # a step every 200 ms
    async with client_for(sim) as http:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "ignore_eos": True}
        task = asyncio.create_task(http.post("/v1/completions", json=body))
        async with asyncio.timeout(1):
            while not sim.engine.waiting:  # arrived; the next step is up to 200 ms away
                await asyncio.sleep(0.001)
        metrics = (await http.get("/metrics")).text
        assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0' in _sorted(metrics)
        assert (await task).status_code == 200
    await sim.engine.stop()


async def test_an_error_rate_makes_a_deliberately_bad_revision() -> None:
    """``--error-rate``: that share of generation requests gets vLLM's engine error (500),
    the rest are answered; a rollout's gates must see the difference."""
    sim = make_sim(error_rate=0.2)
    async with client_for(sim) as http:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
        codes = [(await http.post("/v1/completions", json=body)).status_code for _ in range(200)]
    assert set(codes) == {200, 500}
    assert 20 <= codes.count(500) <= 60, codes.count(500)
    with pytest.raises(ValueError, match="error_rate"):
        make_sim(error_rate=1.5)
    await sim.engine.stop()
