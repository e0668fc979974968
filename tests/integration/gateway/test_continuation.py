"""Mid-stream failover of a **completions** stream (``/v1/completions``, ``stream: true``)
through a real gateway over engine-sim planes: the plane dies after 15 chunks and the
gateway continues the stream on another plane with prompt + text so far and ``max_tokens``
reduced. The chat twin is ``test_gateway.py::test_a_stream_continues_on_another_plane_when_
its_plane_dies``; real vLLM: ``test_continuation_vllm.py``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from tests.integration.gateway.conftest import Fleet


@dataclass
class Streamed:
    """One SSE stream as a client saw it."""

    pieces: list[str] = field(default_factory=list)
    """The text of each chunk that carried a choice (chat ``delta.content``, completions
    ``text``), empty ones included."""
    at: list[float] = field(default_factory=list)
    """When each piece arrived (monotonic)."""
    tokens: list[int] = field(default_factory=list)
    """How many ``token_ids`` each piece had (vLLM's, when asked ``return_token_ids``)."""
    lines: list[str] = field(default_factory=list)
    usage: dict | None = None
    errors: list[dict] = field(default_factory=list)
    plane: str = ""
    head_at: float = 0.0
    """When the response head arrived (monotonic)."""

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def stream(
    url: str,
    path: str,
    body: dict,
    on_piece: Callable[[Streamed], None] | None = None,
    timeout: float = 60,
) -> Streamed:
    """Read one SSE stream of ``path`` whole; ``on_piece`` sees it after each chunk."""
    out = Streamed()
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        out.plane = r.headers.get("x-gpufleet-plane", "")
        out.head_at = time.monotonic()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            out.lines.append(line)
            if line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out.errors.append(event)
                continue
            if event.get("usage"):
                out.usage = event["usage"]
            for choice in event.get("choices") or []:
                text = choice["delta"].get("content") if "delta" in choice else choice["text"]
                out.pieces.append(text or "")
                out.at.append(time.monotonic())
                out.tokens.append(len(choice.get("token_ids") or ()))
                if on_piece is not None:
                    on_piece(out)
    return out


def mid_stream_failovers(fleet: Fleet, gateway: str = "g1") -> float:
    """The gateway's count of streams it continued on another plane."""
    prefix = 'gpufleet_gateway_failovers_total{reason="mid_stream"} '
    lines = [ln for ln in fleet.metrics(gateway).splitlines() if ln.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def completion(max_tokens: int, **extra: object) -> dict:
    return {"model": "chat", "prompt": "hi", "max_tokens": max_tokens, **extra}


@pytest.mark.parametrize("dies", ["router", "sim"])
def test_a_completions_stream_continues_on_another_plane_when_its_plane_dies(
    fleet: Fleet, dies: str
):
    """The plane's router killed (the connection drops), or its only replica (the router
    ends the stream with its own error event): the client gets one completions stream, the
    same text and usage as an uninterrupted one (engine-sim continues its own text exactly,
    as a greedy model would), one ``[DONE]``."""
    body = completion(60, stream=True, ignore_eos=True, stream_options={"include_usage": True})
    before = mid_stream_failovers(fleet)
    reference = stream(f"http://127.0.0.1:{fleet.ports['router-b']}", "/v1/completions", body)
    killed: list[float] = []

    def kill_midway(seen: Streamed) -> None:
        if len(seen.pieces) == 15 and not killed:
            killed.append(time.monotonic())
            fleet.kill(f"{dies}-a")

    try:
        got = stream(fleet.url("g1"), "/v1/completions", body, kill_midway)
    finally:
        fleet.restart(f"{dies}-a")
    assert killed, "the stream ended before the plane was killed"
    assert got.plane == "a"  # it began on a and was continued elsewhere
    assert got.errors == []
    assert got.text == reference.text and len(reference.pieces) == 60
    assert got.lines.count("data: [DONE]") == 1 and got.lines[-1] == "data: [DONE]"
    assert got.usage is not None and reference.usage is not None
    assert got.usage["completion_tokens"] == reference.usage["completion_tokens"] == 60
    assert got.usage["prompt_tokens"] == reference.usage["prompt_tokens"]
    assert got.usage["total_tokens"] == reference.usage["total_tokens"]
    assert mid_stream_failovers(fleet) == before + 1
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})
