"""Simulated vLLM engine: continuous batching under a KV-block budget, deterministic tokens.

One scheduler loop per engine. Each step takes ``1 / tokens_per_s`` seconds and gives every
running sequence one token (the first step is the prefill). Up to ``max_num_seqs`` run; the
rest wait, first come first served, and a request is admitted only when the free KV blocks
hold its prompt plus the tokens generated so far. A running sequence that needs a new block
when none is free preempts the latest admitted one (back to the front of the queue), as
vLLM's recompute preemption does. No model runs: token text is a pure function of the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from workloadplane.enginesim.metrics import EngineMetrics

FinishReason = Literal["stop", "length", "abort"]

_VOCAB = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "can",
    "their",
    "has",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "fleet",
    "gpu",
    "token",
    "cache",
    "batch",
    "queue",
    "replica",
    "model",
    "region",
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "sim-model"
    tokens_per_s: float = 50.0  # decode steps per second (tokens per running sequence)
    max_num_seqs: int = 128
    kv_blocks: int = 4096
    block_size: int = 16
    max_model_len: int = 2048
    startup_delay_s: float = 0.0
    embedding_dim: int = 64
    error_rate: float = 0.0
    """Share of generation requests answered with an engine error (500): a deliberately bad
    revision for rollout tests. Real vLLM has no such knob."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be between 0 and 1")
        if self.tokens_per_s <= 0:
            raise ValueError("tokens_per_s must be > 0")
        if self.max_num_seqs < 1 or self.kv_blocks < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, kv_blocks and block_size must be >= 1")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.kv_blocks * self.block_size < self.max_model_len:
            # vLLM refuses to start too: one full-length sequence must fit in the KV cache.
            raise ValueError(
                f"the KV cache holds {self.kv_blocks * self.block_size} tokens, less than "
                f"max_model_len {self.max_model_len}; raise kv_blocks or lower max_model_len"
            )


@dataclass(frozen=True, slots=True)
class TokenEvent:
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None


@dataclass(eq=False)
class SimRequest:
    """One sequence in the engine; ``events`` carries its tokens to the HTTP handler."""

    prompt_tokens: int
    max_tokens: int
    natural_tokens: int | None  # None: ignore_eos
    seed: str
    stop: tuple[str, ...] = ()
    n_param: int = 1
    max_tokens_param: int | None = None
    offset: int = 0
    """Tokens of ``seed``'s answer already given (a continued final message or prompt):
    generation picks up at that index, as a greedy model continuing its own text would."""
    min_tokens: int = 0
    """No end of answer and no stop string before this many tokens (vLLM masks EOS and
    skips stop strings until then)."""
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    generated: int = 0
    text: str = ""
    blocks: int = 0
    preemptions: int = 0
    arrived_at: float = field(default_factory=time.monotonic)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: FinishReason | None = None


def count_tokens(text: str) -> int:
    """Deterministic stand-in for a tokenizer: about one token per 4 characters."""
    return max(1, math.ceil(len(text) / 4)) if text else 0


def token_text(seed: str, index: int) -> str:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return " " + _VOCAB[int.from_bytes(digest) % len(_VOCAB)]


def continued(seed: str, text: str) -> int | None:
    """How many of ``seed``'s tokens ``text`` is, when it is exactly the start of the answer
    engine-sim gives to ``seed`` (else None)."""
    k, at = 0, 0
    while at < len(text):
        piece = token_text(seed, k)
        if not text.startswith(piece, at):
            return None
        at += len(piece)
        k += 1
    return k


def split_continuation(prompt: str, limit: int = 4096) -> tuple[str, int]:
    """(base prompt, tokens already generated) of a completion prompt that ends with the
    start of engine-sim's own answer to a shorter prompt; (prompt, 0) when it does not."""
    cuts = [i for i, ch in enumerate(prompt) if ch == " "][-limit:]
    for cut in cuts:  # the longest continued answer first
        base, rest = prompt[:cut], prompt[cut:]
        if token_text(base, 0) != rest[: len(token_text(base, 0))]:
            continue
        k = continued(base, rest)
        if k:
            return base, k
    return prompt, 0


def natural_length(seed: str) -> int:
    """Where the simulated model would emit end-of-sequence: 16..79 tokens."""
    digest = hashlib.blake2b(seed.encode(), digest_size=2).digest()
    return 16 + int.from_bytes(digest) % 64


class Engine:
    """The scheduler. ``submit`` returns at once; read tokens from ``request.events``."""

    def __init__(self, config: EngineConfig, metrics: EngineMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.used_blocks = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self.metrics.set_state(0, 0, 0.0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, request: SimRequest) -> None:
        # No gauge update here: vLLM's scheduler stats are taken after each step's admission,
        # so a request that the next step admits never shows in vllm:num_requests_waiting (an
        # autoscaler scraping between would see a queue that is not there).
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        """Client went away: free the request wherever it is (silent if already finished)."""
        if request.finish_reason is not None:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, "abort")
        self._publish()

    # --- the loop -----------------------------------------------------------------------
    async def _loop(self) -> None:
        interval = 1.0 / self.config.tokens_per_s
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            last, debt = time.monotonic(), 0.0
            while self.waiting or self.running:
                # Sleep at least 2 ms: a fast engine takes several steps per wake-up.
                await asyncio.sleep(max(interval - debt, 0.002))
                now = time.monotonic()
                debt += now - last
                last = now
                steps = min(int(debt / interval), 256)
                debt -= steps * interval
                for _ in range(steps):
                    self._step(time.monotonic())

    def _step(self, now: float) -> None:
        self._admit(now)
        batch_tokens = 0
        for request in list(self.running):
            if request.blocks == 0:
                continue  # preempted earlier in this step
            if request.first_token_at is None:
                batch_tokens += request.prompt_tokens + request.generated
            if not self._grow(request):
                continue  # preempted to make room; it waits again
            batch_tokens += 1
            self._emit(request, now)
        if batch_tokens:
            self.metrics.iteration_tokens.observe(batch_tokens)
        self._publish()

    def _admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            need = self._blocks_for(request.prompt_tokens + request.generated)
            if self.used_blocks + need > self.config.kv_blocks:
                return  # FCFS: the head waits for blocks, nobody overtakes it
            self.waiting.popleft()
            request.blocks = need
            self.used_blocks += need
            if request.scheduled_at is None:
                request.scheduled_at = now
                self.metrics.admitted(request.prompt_tokens)
            self.running.append(request)

    def _grow(self, request: SimRequest) -> bool:
        """Make room for one more token; preempt the latest admitted sequence if needed."""
        need = self._blocks_for(request.prompt_tokens + request.generated + 1)
        while need > request.blocks:
            if self.used_blocks < self.config.kv_blocks:
                request.blocks += 1
                self.used_blocks += 1
                continue
            victim = self.running[-1]
            self._release(victim)
            self.waiting.appendleft(victim)
            victim.preemptions += 1
            self.metrics.preemptions.inc()
            if victim is request:
                return False
        return True

    def _emit(self, request: SimRequest, now: float) -> None:
        text = token_text(request.seed, request.offset + request.generated)
        request.generated += 1
        request.text += text
        self.metrics.generation_tokens.inc()
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.ttft.observe(now - request.arrived_at)
        else:
            gap = now - (request.last_token_at or now)
            self.metrics.inter_token.observe(gap)
        request.last_token_at = now
        # a stop string ending in this token's text (earlier ones were looked for before,
        # or were before min_tokens, where vLLM does not look)
        early = request.generated < request.min_tokens
        found = [] if early else [(_stop_at(request.text, t, len(text)), t) for t in request.stop]
        stop, cut = next(((t, at) for at, t in found if t and at >= 0), (None, -1))
        if stop is not None:
            visible = text[: max(0, len(text) - (len(request.text) - cut))]
            request.events.put_nowait(TokenEvent(visible, "stop", stop))
            self._finish(request, "stop", notify=False)
        elif (
            request.natural_tokens is not None
            and request.offset + request.generated >= request.natural_tokens
        ):
            request.events.put_nowait(TokenEvent(text, "stop"))
            self._finish(request, "stop", notify=False)
        elif request.generated >= request.max_tokens:
            request.events.put_nowait(TokenEvent(text, "length"))
            self._finish(request, "length", notify=False)
        else:
            request.events.put_nowait(TokenEvent(text))

    def _finish(self, request: SimRequest, reason: FinishReason, notify: bool = True) -> None:
        request.finish_reason = reason
        if request in self.running:
            self._release(request)
        if notify:
            request.events.put_nowait(TokenEvent("", reason))
        self.metrics.finished(request, time.monotonic())

    def _release(self, request: SimRequest) -> None:
        self.running.remove(request)
        self.used_blocks -= request.blocks
        request.blocks = 0

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.block_size)

    def _publish(self) -> None:
        self.metrics.set_state(
            len(self.running), len(self.waiting), self.used_blocks / self.config.kv_blocks
        )


async def drain_events(request: SimRequest) -> AsyncIterator[TokenEvent]:
    """Yield a request's tokens until the one that carries its finish reason."""
    while True:
        event = await request.events.get()
        yield event
        if event.finish_reason is not None:
            return


def _stop_at(text: str, stop: str, new: int) -> int:
    """Where ``stop`` starts in ``text`` when it ends within its last ``new`` characters
    (-1: it does not)."""
    if not stop:
        return -1
    return text.find(stop, max(0, len(text) - new - len(stop) + 1))
