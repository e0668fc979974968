"""Engine simulator: sampling parameters are checked as vLLM 0.32 checks them
(``SamplingParams._verify_args``), with its messages and its 400 error shape."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import BadRequestError

from tests.unit.workloadplane.test_enginesim import client_for, make_sim, openai_for
from workloadplane.enginesim import Simulator

ROUTES = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "tiny", "prompt": "hi"},
}

# (parameters, vLLM's message, vLLM's `param`)
REJECTED: list[tuple[dict[str, Any], str, str | None]] = [
    ({"temperature": -3}, "temperature must be non-negative, got -3.0. "
     "(parameter=temperature, value=-3.0)", "temperature"),
    ({"temperature": 2.5}, "temperature must be in [0, 2], got 2.5. "
     "(parameter=temperature, value=2.5)", "temperature"),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5. (parameter=top_p, value=1.5)", "top_p"),
    ({"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2.", None),
    ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5.", None),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2], got 2.5.", None),
    ({"frequency_penalty": -3}, "frequency_penalty must be in [-2, 2], got -3.0.", None),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.0.", None),
    ({"n": 0}, "n must be at least 1, got 0.", None),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0. "
     "(parameter=max_tokens, value=0)", "max_tokens"),
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.", None),
    ({"min_tokens": 9, "max_tokens": 4},
     "min_tokens must be less than or equal to max_tokens=4, got 9.", None),
    ({"stop": ["ok", ""]}, "stop cannot contain an empty string.", None),
    # vLLM's order: n first, then the penalties, then temperature.
    ({"n": 0, "temperature": -1}, "n must be at least 1, got 0.", None),
    ({"presence_penalty": 3, "temperature": -1}, "presence_penalty must be in [-2, 2], got 3.0.",
     None),
]  # fmt: skip

ACCEPTED: list[dict[str, Any]] = [
    {"temperature": 0},
    {"temperature": 2},
    {"top_p": 1},
    {"top_p": 0.01},
    {"top_k": -1},
    {"top_k": 0},
    {"top_k": 40},
    {"min_p": 0},
    {"presence_penalty": -2, "frequency_penalty": 2},
    {"repetition_penalty": 1.2},
    {"min_tokens": 4, "max_tokens": 4},
    {"temperature": None, "top_p": None, "top_k": None},
]


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    s = make_sim()
    yield s
    await s.engine.stop()


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize(("params", "message", "param"), REJECTED)
async def test_invalid_sampling_parameters_get_vllms_400(
    sim: Simulator, route: str, params: dict[str, Any], message: str, param: str | None
) -> None:
    async with client_for(sim) as http:
        response = await http.post(route, json=ROUTES[route] | params)
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    }


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("params", ACCEPTED)
async def test_valid_sampling_parameters_are_served(
    sim: Simulator, route: str, params: dict[str, Any]
) -> None:
    async with client_for(sim) as http:
        response = await http.post(route, json=ROUTES[route] | {"max_tokens": 4} | params)
    assert response.status_code == 200, response.text


async def test_streaming_request_is_refused_before_any_event(sim: Simulator) -> None:
    async with client_for(sim) as http:
        response = await http.post(
            "/v1/chat/completions",
            json=ROUTES["/v1/chat/completions"] | {"stream": True, "temperature": -3},
        )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "temperature"


async def test_openai_sdk_raises_bad_request_for_a_negative_temperature(sim: Simulator) -> None:
    client = openai_for(sim)
    with pytest.raises(BadRequestError, match="temperature must be non-negative"):
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-3
        )


@pytest.mark.parametrize("route", [*sorted(ROUTES), "/v1/embeddings"])
async def test_a_body_nested_too_deeply_gets_a_400_not_a_500(sim: Simulator, route: str) -> None:
    """Past the JSON parser's recursion limit the simulator answers as for any undecodable
    body (it was a 500)."""
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with client_for(sim) as http:
        response = await http.post(route, content=deep)
    assert response.status_code == 400
    error = response.json()["error"]  # vLLM's shape for an undecodable body
    assert (error["type"], error["param"]) == ("Bad Request", "body")
    assert "JSON decode error: nested too deeply" in error["message"]


# What vLLM 0.32 (CPU) answered to a lone surrogate (JSON "\ud800"), measured 2026-12-07;
# the simulator answered 500 (UTF-8 cannot encode it).
SURROGATE_TEXT = [
    ("/v1/completions", b'{"model": "tiny", "prompt": "\\ud800", "max_tokens": 2}'),
    (
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
    ),
    ("/v1/embeddings", b'{"model": "tiny", "input": "\\ud800"}'),
]


@pytest.mark.parametrize(("route", "body"), SURROGATE_TEXT)
async def test_a_lone_surrogate_in_the_text_gets_vllms_400(
    sim: Simulator, route: str, body: bytes
) -> None:
    async with client_for(sim) as http:
        response = await http.post(route, content=body)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "TextEncodeInput must be Union[TextInputSequence, "
        "Tuple[InputSequence, InputSequence]]",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


@pytest.mark.parametrize(("route", "body"), SURROGATE_TEXT)
async def test_a_lone_surrogate_written_as_utf8_bytes_gets_the_same_400(
    sim: Simulator, route: str, body: bytes
) -> None:
    """Written as the bytes UTF-8 would give it (invalid UTF-8, which ``json.loads`` reads
    with surrogatepass, as vLLM's FastAPI does) it is the same text: the same 400, not
    measured against vLLM. It was a 500: the check looked for JSON escapes only."""
    async with client_for(sim) as http:
        escaped = await http.post(route, content=body)
        written = await http.post(route, content=body.replace(b"\\ud800", b"\xed\xa0\x80"))
    assert written.status_code == 400 and written.json() == escaped.json()


async def test_a_lone_surrogate_in_the_model_name_gets_vllms_400(sim: Simulator) -> None:
    body = b'{"model": "\\ud800", "prompt": "hi", "max_tokens": 2}'
    async with client_for(sim) as http:
        response = await http.post("/v1/completions", content=body)
        served = await http.post(
            "/v1/completions", content=b'{"model": "tiny", "prompt": "a\\u0000b", "max_tokens": 2}'
        )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "'utf-8' codec can't encode character '\\ud800' in position 32: surrogates not allowed"
    )
    assert served.status_code == 200  # a NUL is valid text: vLLM serves it


async def test_min_tokens_holds_the_end_of_the_answer_back_as_vllm_does(sim: Simulator) -> None:
    """vLLM masks the end of the answer until min_tokens (benchmarks use it to fix output
    lengths); the simulator checked the value and then ended at its natural length."""
    body = ROUTES["/v1/chat/completions"] | {"max_tokens": 300, "min_tokens": 200}
    async with client_for(sim) as http:
        answer = (await http.post("/v1/chat/completions", json=body)).json()
    assert answer["usage"]["completion_tokens"] >= 200


async def test_a_null_max_tokens_on_completions_is_16(sim: Simulator) -> None:
    """vLLM's normalize_null_max_tokens; it was the whole context here."""
    body = ROUTES["/v1/completions"] | {"max_tokens": None, "ignore_eos": True}
    async with client_for(sim) as http:
        answer = (await http.post("/v1/completions", json=body)).json()
    assert answer["usage"]["completion_tokens"] == 16


async def test_a_prompt_far_over_the_context_is_refused_at_once(sim: Simulator) -> None:
    """Looking for a continuation in a 2 MB prompt took seconds on the event loop, every
    stream and /health stalled meanwhile; it is over the context whatever it holds."""
    body = ROUTES["/v1/completions"] | {"prompt": "a " * 1_000_000}
    started = time.perf_counter()
    async with client_for(sim) as http:
        answer = await http.post("/v1/completions", json=body)
    assert answer.status_code == 400 and "maximum context length" in answer.text
    assert time.perf_counter() - started < 1.0
