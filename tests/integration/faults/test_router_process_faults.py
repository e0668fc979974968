"""Issue 12 item 5 against the real `up` fleet: the plane's router is a process of its own, so
killing a plane's agent costs nothing in flight and refuses no new connection."""

from __future__ import annotations

import signal
import threading
import time

import httpx
from openai import OpenAI

from tests.integration.faults.conftest import Fleet
from tests.integration.test_up import _wait_until


def test_killing_an_agent_costs_nothing_in_flight(fleet: Fleet) -> None:
    """Item 5: the router ran in the agent's process: a killed agent cut in-flight streams and
    refused new connections for 2–5 s."""
    cluster = fleet.serving("eu-assistant")
    client = OpenAI(
        base_url=fleet.router(cluster) + "/v1", api_key="none", timeout=60, max_retries=0
    )
    chunks: list[str] = []
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            for chunk in client.chat.completions.create(
                model="eu-assistant",
                messages=[{"role": "user", "content": "long story"}],
                max_tokens=300,
                stream=True,
            ):
                chunks.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        except BaseException as exc:
            failure.append(exc)

    reader = threading.Thread(target=stream)
    reader.start()
    _wait_until(lambda: len(chunks) >= 3 or not reader.is_alive(), 30, "the stream to flow")
    agent = fleet.child(f"agent --cluster {cluster}")
    agent.send_signal(signal.SIGKILL)
    refused = 0
    for _ in range(50):  # 5 s of new connections while the agent is gone or restarting
        try:
            httpx.get(fleet.router(cluster) + "/v1/models", timeout=2).raise_for_status()
        except httpx.HTTPError:
            refused += 1
        time.sleep(0.1)
    reader.join(60)
    assert not failure, f"the stream in flight was cut: {failure[0]!r}"
    assert len(chunks) > 3
    assert refused == 0, f"{refused} of 50 new requests failed while the agent restarted"
