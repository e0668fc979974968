"""HTTP front of the engine simulator: vLLM's OpenAI-compatible routes, SSE and /metrics.

Until the start-up delay has passed every route answers 503 (``/health`` included), so a
runtime that polls ``/health`` sees a cold start. Bad input gets vLLM's error shape.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import random
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from gpufleet_logging import clean_request_id, request_id_bound
from workloadplane.enginesim import protocol as p
from workloadplane.enginesim.engine import (
    Engine,
    EngineConfig,
    SimRequest,
    TokenEvent,
    drain_events,
    natural_length,
)
from workloadplane.enginesim.metrics import EngineMetrics

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VLLM_VERSION}-enginesim"


class Simulator:
    """One simulated replica: config, engine and metrics; ``app`` is its ASGI app."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.ready_at = clock() + config.startup_delay_s
        self.metrics = EngineMetrics(config)
        self.engine = Engine(config, self.metrics)
        self._errors = random.Random(0)
        self.app = _build_app(self)

    @property
    def ready(self) -> bool:
        return self.clock() >= self.ready_at

    def check(self, model: str | None, body: p._Request | None = None) -> None:
        if not self.ready:
            raise p.ApiError("engine is starting up; retry when /health answers 200", 503)
        self.engine.start()
        if model is not None and model != self.config.model:
            raise p.ApiError(
                f"The model `{model}` does not exist. Valid aliases: {self.config.model}.",
                404,
                "model",
            )
        if body is not None:
            body.check(self.config.max_model_len)
            if self.config.error_rate and self._errors.random() < self.config.error_rate:
                raise p.ApiError(
                    "EngineCore encountered an issue (engine-sim --error-rate "
                    f"{self.config.error_rate:g})",
                    500,
                )

    def make_request(
        self,
        body: p._Request,
        prompt_tokens: int,
        seed: str,
        requested: int | None,
        offset: int = 0,
    ) -> SimRequest:
        cfg = self.config
        if prompt_tokens >= cfg.max_model_len:
            raise p.ApiError(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"your request has {prompt_tokens} input tokens. Please reduce the length of "
                "the input messages.",
                param="messages",
            )
        # (more than max_model_len was refused by the request's own check) as vLLM 0.32 (`get_max_tokens`): the answer is cut to what the context has left
        # (finish_reason "length"), not refused — a load test asking for the context length
        # failed whole on the simulator and passed on vLLM
        room = cfg.max_model_len - prompt_tokens
        max_tokens = room if requested is None else min(requested, room)
        return SimRequest(
            prompt_tokens=max(1, prompt_tokens),
            max_tokens=max_tokens,
            natural_tokens=None if body.ignore_eos else max(natural_length(seed), body.min_tokens),
            seed=seed,
            stop=body.stops,
            n_param=body.n,
            max_tokens_param=requested,
            offset=offset,
            min_tokens=body.min_tokens,
        )


class RequestIdBinding:
    """Pure ASGI: the request's X-Request-Id is on every line logged while it is served."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = dict(scope["headers"]).get(b"x-request-id") if scope["type"] == "http" else None
        with request_id_bound(clean_request_id(given)):
            await self.app(scope, receive, send)


def _accepted(what: str, request: SimRequest) -> None:
    # counts only: never a prompt or a completion
    log.debug("%s: %d prompt tokens, up to %d new", what, request.prompt_tokens, request.max_tokens)


def _build_app(sim: Simulator) -> FastAPI:
    app = FastAPI(title="gpufleet engine-sim", docs_url=None, redoc_url=None)
    app.add_middleware(RequestIdBinding)

    @app.exception_handler(p.ApiError)
    async def api_error(_: Request, exc: p.ApiError) -> JSONResponse:
        return exc.response()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if sim.ready else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VLLM_VERSION}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(sim.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        sim.check(None)
        return {"object": "list", "data": [_model_card(sim.config)]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = p.parse(p.ChatRequest, await request.body())
        sim.check(body.model, body)
        seed, prompt_tokens, offset = body.continued()
        sim_request = sim.make_request(
            body, prompt_tokens, seed, body.requested_max_tokens(), offset
        )
        rid = p.new_id("chatcmpl", request.headers.get("x-request-id"))
        head = {"id": rid, "object": "chat.completion", "created": p.now_s()}
        head["model"] = sim.config.model
        _accepted("chat completion", sim_request)
        sim.engine.submit(sim_request)
        if body.stream:
            stream = _chat_stream(sim, sim_request, head, body.stream_options)
            return _event_stream(stream, request)
        try:
            [(text, finish, stop_reason)] = await _collect_while_there(request, [sim_request])
        except _ClientGone:
            return Response(status_code=499)  # nobody reads it; the slot is free again
        finally:
            sim.engine.abort(sim_request)
        message = {"role": "assistant", "content": text, "refusal": None}
        message |= {"annotations": None, "audio": None, "function_call": None, "reasoning": None}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "token_ids": None,
            "routed_experts": None,
        }
        return JSONResponse(
            {
                **head,
                "object": "chat.completion",
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": FINGERPRINT,
                "usage": p.usage(sim_request.prompt_tokens, sim_request.generated),
                **dict.fromkeys(_CHAT_TAIL),
            }
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = p.parse(p.CompletionRequest, await request.body())
        sim.check(body.model, body)
        prompts = body.prompts()
        if body.stream and len(prompts) > 1:
            raise p.ApiError("engine-sim streams one prompt at a time; send one", param="prompt")
        if len(prompts) == 1 and isinstance(body.prompt, str | list) and _one_string(body.prompt):
            text = str(body.prompt if isinstance(body.prompt, str) else body.prompt[0])
            if len(text) > 16 * sim.config.max_model_len:  # looking for a continuation in
                # 2 MB hashed it 512 times on the event loop: seconds of every stream stalled
                raise p.ApiError(
                    f"This model's maximum context length is {sim.config.max_model_len} "
                    f"tokens. However, your request has more input tokens than that "
                    f"({len(text)} characters). Please reduce the length of the input.",
                    param="prompt",
                )
            seed, tokens, offset = body.continued()
            sims = [sim.make_request(body, tokens, seed, body.max_tokens, offset)]
        else:
            sims = [sim.make_request(body, n, seed, body.max_tokens) for seed, n in prompts]
        rid = p.new_id("cmpl", request.headers.get("x-request-id"))
        head = {"id": rid, "object": "text_completion", "created": p.now_s()}
        head["model"] = sim.config.model
        for r in sims:
            _accepted("completion", r)
            sim.engine.submit(r)
        if body.stream:
            return _event_stream(
                _completion_stream(sim, sims[0], head, body.stream_options), request
            )
        choices = []
        try:
            answers = await _collect_while_there(request, sims)
        except _ClientGone:
            return Response(status_code=499)
        finally:
            for r in sims:
                sim.engine.abort(r)
        for i, (text, finish, stop_reason) in enumerate(answers):
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            choice |= {"stop_reason": stop_reason, "token_ids": None}
            choice |= dict.fromkeys(("prompt_logprobs", "prompt_token_ids", "routed_experts"))
            choices.append(choice)
        used = p.usage(sum(r.prompt_tokens for r in sims), sum(r.generated for r in sims))
        return JSONResponse(
            {
                **head,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": FINGERPRINT,
                "usage": used,
                **dict.fromkeys(("kv_transfer_params", "ec_transfer_params", "metrics")),
            }
        )

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = p.parse(p.EmbeddingRequest, await request.body())
        sim.check(body.model)
        inputs = p.CompletionRequest(prompt=body.input).prompts()
        dim = body.dimensions or sim.config.embedding_dim
        if dim > sim.config.embedding_dim:  # the vector is built: an unbounded size is a DoS
            raise p.ApiError(
                f"dimensions must be at most {sim.config.embedding_dim}, this model's "
                f"embedding size (got {dim})",
                param="dimensions",
            )
        if body.encoding_format not in ("float", "base64"):
            raise p.ApiError("encoding_format must be 'float' or 'base64'", param="encoding_format")
        data = []
        for i, (seed, _) in enumerate(inputs):
            vector = _embedding(seed, dim)
            encoded: list[float] | str = vector
            if body.encoding_format == "base64":
                encoded = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"index": i, "object": "embedding", "embedding": encoded})
        tokens = sum(t for _, t in inputs)
        sim.metrics.prompt_tokens.inc(tokens)
        return JSONResponse(
            {
                "id": p.new_id("embd", request.headers.get("x-request-id")),
                "object": "list",
                "created": p.now_s(),
                "model": sim.config.model,
                "data": data,
                "usage": p.usage(tokens, 0),
            }
        )

    return app


_CHAT_TAIL = (
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
)


def _one_string(prompt: object) -> bool:
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
    )


def _model_card(config: EngineConfig) -> dict[str, Any]:
    return {
        "id": config.model,
        "object": "model",
        "created": p.now_s(),
        "owned_by": "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [
            {
                "id": p.new_id("modelperm"),
                "object": "model_permission",
                "created": p.now_s(),
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


class _ClientGone(Exception):
    """The client of a non-streamed request went away before its answer."""


async def _collect_while_there(
    http: Request, requests: list[SimRequest]
) -> list[tuple[str, str, str | None]]:
    """Each request's answer, unless the client goes first: then ``_ClientGone`` (the
    caller aborts them). vLLM cancels on a disconnect (`with_cancellation`); this kept the
    slot — and `num_requests_running`, KV use — until the whole answer was made."""
    answers = asyncio.ensure_future(asyncio.gather(*(_collect(r) for r in requests)))
    gone = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({answers, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answers.done():
        answers.cancel()
        raise _ClientGone
    return answers.result()


async def _disconnected(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _collect(request: SimRequest) -> tuple[str, str, str | None]:
    text: list[str] = []
    last = TokenEvent("", "abort")
    async for event in drain_events(request):
        text.append(event.text)
        last = event
    return "".join(text), last.finish_reason or "abort", last.stop_reason


def _event_stream(chunks: AsyncIterator[bytes], request: Request) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if rid := request.headers.get("x-request-id"):
        headers["X-Request-Id"] = rid
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)


async def _stream(
    sim: Simulator,
    request: SimRequest,
    options: p.StreamOptions | None,
    make_chunk: Callable[[TokenEvent], dict[str, Any]],
    first: dict[str, Any] | None,
    head: dict[str, Any],
) -> AsyncIterator[bytes]:
    continuous = options is not None and options.continuous_usage_stats
    try:
        if first is not None:
            yield p.sse(first)
        async for event in drain_events(request):
            chunk = make_chunk(event)
            if continuous:
                chunk["usage"] = p.usage(request.prompt_tokens, request.generated, details=False)
            yield p.sse(chunk)
        if options is not None and options.include_usage:
            used = p.usage(request.prompt_tokens, request.generated, details=False)
            yield p.sse({**head, "choices": [], "usage": used, "system_fingerprint": FINGERPRINT})
        yield p.sse("[DONE]")
    finally:
        sim.engine.abort(request)  # silent when it finished; frees it when the client left


def _chat_stream(
    sim: Simulator, request: SimRequest, head: dict[str, Any], options: p.StreamOptions | None
) -> AsyncIterator[bytes]:
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(event: TokenEvent) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": event.text},
            "logprobs": None,
            "finish_reason": event.finish_reason,
        }
        if event.finish_reason is not None:
            choice["stop_reason"] = event.stop_reason
        choice["token_ids"] = None
        return {**head, "choices": [choice]}

    first = {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    return _stream(sim, request, options, chunk, first, head)


def _completion_stream(
    sim: Simulator, request: SimRequest, head: dict[str, Any], options: p.StreamOptions | None
) -> AsyncIterator[bytes]:
    head = {**head, "object": "text_completion"}

    def chunk(event: TokenEvent) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": event.text,
            "logprobs": None,
            "finish_reason": event.finish_reason,
            "stop_reason": event.stop_reason,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        return {**head, "choices": [choice]}

    return _stream(sim, request, options, chunk, None, head)


def _embedding(seed: str, dim: int) -> list[float]:
    raw = hashlib.shake_256(seed.encode()).digest(dim * 2)
    values = [int.from_bytes(raw[i : i + 2]) / 65535.0 - 0.5 for i in range(0, dim * 2, 2)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


def create_app(config: EngineConfig | None = None) -> FastAPI:
    """The ASGI app of one simulated replica (``Simulator(config).app``)."""
    return Simulator(config or EngineConfig()).app
