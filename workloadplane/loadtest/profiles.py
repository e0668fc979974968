"""What a load test sends and when: arrival times per profile and each request's body. Pure.

Open loop: request i starts at its arrival time whatever the answers do (a slow server does
not slow the load down, as real users do not wait for each other). Profiles:

- ``steady``: ``rate`` requests a second throughout.
- ``diurnal``: a day compressed into the run: from 10 % of ``rate`` at the start and end
  ("night") to ``rate`` halfway ("noon"), a raised cosine; the mean is 55 % of ``rate``.
- ``burst``: ``rate`` as a base, and every ``BURST_PERIOD_S`` a burst of
  ``BURST_FACTOR`` × ``rate`` for ``BURST_S`` (the seed: "test bursts, not only the
  average").
- ``abnormal``: ``rate`` throughout, one request in ``ABNORMAL_EVERY`` malformed or
  hostile in one of the :data:`ABNORMAL` ways; a server must answer each with a 4xx (or,
  for a client that goes away, carry on serving the others), never a 5xx.

Every size is bounded: ``rate`` ≤ :data:`MAX_RATE`, ``duration`` ≤ :data:`MAX_DURATION_S`,
at most :data:`MAX_REQUESTS` requests, ``max_tokens`` ≤ :data:`MAX_TOKENS`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal

Profile = Literal["steady", "diurnal", "burst", "abnormal"]
PROFILES: tuple[Profile, ...] = ("steady", "diurnal", "burst", "abnormal")
MAX_RATE = 500.0
MAX_DURATION_S = 3600.0
MAX_REQUESTS = 200_000
MAX_TOKENS = 4096
BURST_PERIOD_S = 10.0
BURST_S = 2.0
BURST_FACTOR = 4.0
ABNORMAL_EVERY = 4
ABNORMAL = (
    "bad_json",
    "unknown_model",
    "negative_max_tokens",
    "bad_temperature",
    "empty_messages",
    "prompt_too_long",
    "client_goes_away",
)
"""The abnormal requests, in turn: a body that is not JSON, a model nobody serves,
``max_tokens: -1``, ``temperature: -3``, no messages, a prompt far over any context
(~256 KiB), and a streamed request the client abandons after its first chunk."""
PROMPTS = (
    "Say hello to the platform team.",
    "Summarise in three sentences why GPU capacity planning matters for inference. " * 4,
    "Write a short incident report about a region that lost power during peak traffic. " * 16,
)
"""Short, medium and long prompts, in turn (prompt length changes TTFT)."""


class LoadTestError(ValueError):
    """A load test asked for more than the bounds allow; the message says what to change."""


@dataclass(frozen=True)
class Plan:
    profile: Profile
    model: str
    rate: float
    duration_s: float
    max_tokens: int = 64
    stream_share: float = 0.5
    """The share of requests that stream (SSE); the others wait for the whole answer."""

    def check(self) -> None:
        if self.profile not in PROFILES:
            raise LoadTestError(f"--profile must be one of {', '.join(PROFILES)}")
        if not 0 < self.rate <= MAX_RATE:
            raise LoadTestError(f"--rate must be above 0 and at most {MAX_RATE:g} requests/s")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise LoadTestError(f"--duration must be above 0 and at most {MAX_DURATION_S:g} s")
        if not 1 <= self.max_tokens <= MAX_TOKENS:
            raise LoadTestError(f"--max-tokens must be from 1 to {MAX_TOKENS}")
        if not 0 <= self.stream_share <= 1:
            raise LoadTestError("--stream-share must be from 0 to 1")
        if not self.model or len(self.model) > 256:
            raise LoadTestError("name the deployment (its model name), at most 256 characters")
        peak = self.rate * (BURST_FACTOR if self.profile == "burst" else 1.0)
        if peak * self.duration_s > MAX_REQUESTS * 1.5:
            raise LoadTestError(
                f"that is over {MAX_REQUESTS:,} requests: lower --rate or --duration"
            )


def rate_at(plan: Plan, t: float) -> float:
    """Requests a second the profile asks for at ``t`` seconds into the run."""
    if plan.profile == "diurnal":
        return plan.rate * (0.55 - 0.45 * math.cos(2 * math.pi * t / plan.duration_s))
    if plan.profile == "burst" and t % BURST_PERIOD_S >= BURST_PERIOD_S - BURST_S:
        return plan.rate * BURST_FACTOR
    return plan.rate


def arrivals(plan: Plan) -> list[float]:
    """Start times (seconds from the start) of every request: each the moment the integral
    of :func:`rate_at` reaches the next whole request, on a 1 ms grid (the first at 0)."""
    plan.check()
    times: list[float] = []
    owed = 1.0
    for ms in range(round(plan.duration_s * 1000)):
        t = ms / 1000
        while owed >= 1.0 - 1e-9 and len(times) < MAX_REQUESTS:
            times.append(t)
            owed -= 1.0
        owed += rate_at(plan, t) / 1000
    return times


@dataclass(frozen=True)
class Request:
    path: str
    body: bytes
    stream: bool
    kind: str
    """``normal`` or one of :data:`ABNORMAL`."""

    @property
    def abnormal(self) -> bool:
        return self.kind != "normal"


def request(plan: Plan, i: int) -> Request:
    """The ``i``-th request of the run (deterministic: the same plan sends the same load)."""
    share = plan.stream_share  # spread evenly: request i streams when it crosses a whole
    stream = math.floor((i + 1) * share) > math.floor(i * share)
    if plan.profile == "abnormal" and i % ABNORMAL_EVERY == ABNORMAL_EVERY - 1:
        return _abnormal(plan, ABNORMAL[(i // ABNORMAL_EVERY) % len(ABNORMAL)])
    payload = _chat(plan.model, PROMPTS[i % len(PROMPTS)], plan.max_tokens, stream)
    return Request("/v1/chat/completions", _encode(payload), stream, "normal")


def _chat(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, object]:
    payload: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    return payload


def _abnormal(plan: Plan, kind: str) -> Request:
    path = "/v1/chat/completions"
    good = _chat(plan.model, PROMPTS[0], plan.max_tokens, False)
    if kind == "bad_json":
        return Request(
            path, b'{"model": "' + plan.model.encode() + b'", "messages": [', False, kind
        )
    if kind == "unknown_model":
        return Request(path, _encode({**good, "model": "no-such-model-x"}), False, kind)
    if kind == "negative_max_tokens":
        return Request(path, _encode({**good, "max_tokens": -1}), False, kind)
    if kind == "bad_temperature":
        return Request(path, _encode({**good, "temperature": -3}), False, kind)
    if kind == "empty_messages":
        return Request(path, _encode({**good, "messages": []}), False, kind)
    if kind == "prompt_too_long":
        huge = "lorem ipsum " * 22_000  # ~256 KiB, ~44k words: over any demo context
        messages = [{"role": "user", "content": huge}]
        return Request(path, _encode({**good, "messages": messages}), False, kind)
    if kind == "client_goes_away":
        body = _chat(plan.model, PROMPTS[1], plan.max_tokens, True)
        return Request(path, _encode(body), True, kind)
    raise LoadTestError(f"no abnormal request called {kind!r}")


def _encode(payload: dict[str, object]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()
