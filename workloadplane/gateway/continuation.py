"""Mid-stream failover, the pure part: follow an OpenAI SSE stream as it is relayed, and
build the request that continues it on another plane. No I/O.

``StreamTracker.feed`` splits upstream bytes into whole SSE events (a partial event of a
stream that broke is never forwarded), remembers the text delivered and how many tokens
carried it, drops the role-only opening chunk of a continuation, and makes the ``usage`` of
the last segment the whole stream's. Token counts are the engine's own: ``counted`` asks it
for a running ``usage`` in every chunk (``stream_options.continuous_usage_stats``, vLLM's and
engine-sim's), because chunks are not tokens — real vLLM sends a chunk with no text for a
token that ends inside a UTF-8 character, and one chunk for several tokens when its API
server falls behind — and a continued prompt, re-tokenized, need not count what the first
segment generated; the tracker takes out again what the client did not ask for. An engine
that sends no running usage is counted one token per chunk with text.

``continuation`` builds the next segment's body: chat re-sends the messages plus the text
delivered as a final assistant message with ``continue_final_message: true,
add_generation_prompt: false`` (vLLM's parameters); completions send prompt + text so far;
``max_tokens`` is reduced by the tokens delivered. ``not_continuable`` says why a request
cannot be continued safely:

- ``n`` or ``best_of`` above 1 (several choices interleave in one stream);
- completions with ``echo``, or a prompt that is not one string (token ids, a batch);
- ``/v1/embeddings`` (never streamed anyway);
- a tool call in flight (``delta.tool_calls`` seen: half a call cannot be continued);
- an SSE event over ``MAX_EVENT_BYTES`` (passed on as it came, no longer tracked).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from controlplane.contracts import loads

DONE = b"data: [DONE]"
MAX_EVENT_BYTES = 1024 * 1024
"""What the tracker buffers of one SSE event; a bigger one is relayed untracked."""

MAX_TRACKED_CHARS = 4 * 1024 * 1024
"""Text a stream's tracker keeps for a continuation: past it (more than any model's context)
the stream is relayed on but no longer continued, and its text is not held."""


GUIDED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "structured_outputs")  # fmt: skip
"""Constrained decoding: what vLLM enforces from the answer's first token on."""


def not_continuable(path: str, payload: dict[str, Any]) -> str:
    """Why a streamed request cannot be continued on another plane ("" if it can)."""
    if payload.get("n") not in (None, 1) or payload.get("best_of") not in (None, 1):
        return "n or best_of is above 1"
    plain = {None, "", "text"}  # OpenAI's default response_format is {"type": "text"}
    fmt = payload.get("response_format")
    guided = [k for k in GUIDED if payload.get(k) not in (None, {}, [], "")]
    kind = fmt.get("type") if isinstance(fmt, dict) else 0
    if kind is None or (isinstance(kind, str) and kind in plain):
        guided = [k for k in guided if k != "response_format"]
    if guided:  # a grammar restarted on the continued text would not hold
        return f"{guided[0]} is set"
    if path.endswith("/chat/completions"):
        if payload.get("echo"):  # vLLM would echo the continued message: text twice
            return "echo is set"
        messages = payload.get("messages")
        return "" if isinstance(messages, list) and messages else "no messages"
    if path.endswith("/completions"):
        if payload.get("echo"):
            return "echo is set"
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return ""
        return "" if isinstance(prompt, str) else "the prompt is not one string"
    return "only chat and completions streams are continued"


def counted(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` asking the engine for its running token counts in every chunk."""
    options = payload.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options.update(include_usage=True, continuous_usage_stats=True)
    return {**payload, "stream_options": options}


@dataclass
class StreamTracker:
    chat: bool
    usage_asked: bool = True
    """The client asked for the final ``usage`` chunk (``stream_options.include_usage``)."""
    every_usage_asked: bool = True
    """... and for a running ``usage`` in every chunk (``continuous_usage_stats``)."""
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    """Tokens delivered so far: the engine's running count, else one per chunk with text."""
    prompt_tokens: int | None = None
    """The prompt's tokens as the first segment's engine counted them (None: not told)."""
    earlier_tokens: int = 0
    """Tokens of the segments before the current one (added to the final usage)."""
    tool_call: bool = False
    reasoning: bool = False
    """A reasoning delta was streamed: a continuation would reason again, from the start."""
    finished: bool = False
    """A choice said why it stopped (``finish_reason``): nothing is left to generate."""
    done: bool = False
    upstream_error: str = ""
    """The error event a plane ended its stream with (a replica died inside it)."""
    segment: int = 0
    untracked: bool = False
    """An event was over MAX_EVENT_BYTES: what was delivered is no longer known exactly."""
    _buffer: bytearray = field(default_factory=bytearray)
    _chars: int = 0  # characters in text

    @classmethod
    def of(cls, path: str, payload: dict[str, Any]) -> StreamTracker:
        """The tracker of the stream the client asked for with ``payload``."""
        options = payload.get("stream_options")
        options = options if isinstance(options, dict) else {}
        usage = bool(options.get("include_usage"))
        every = usage and bool(options.get("continuous_usage_stats"))
        return cls(path.endswith("/chat/completions"), usage_asked=usage, every_usage_asked=every)

    @property
    def why_not(self) -> str:
        """Why what this stream delivered cannot be continued ("" if it can)."""
        if self.tool_call:
            return "a tool call was in flight"
        if self.reasoning:
            return "it was streaming reasoning"
        if self.untracked:
            return f"an event was over {MAX_EVENT_BYTES} bytes"
        if self._chars > MAX_TRACKED_CHARS:
            return f"it delivered over {MAX_TRACKED_CHARS} characters"
        return ""

    @property
    def delivered(self) -> str:
        return "".join(self.text)

    def feed(self, chunk: bytes) -> list[bytes]:
        """Whole events of ``chunk`` (plus what was buffered) to send on, each with its
        blank line; the rest waits for the next chunk."""
        tail = max(len(self._buffer) - 1, 0)
        self._buffer += chunk  # in place: an event sent a byte at a time costs linear time
        if b"\n\n" not in self._buffer[tail:]:
            if len(self._buffer) > MAX_EVENT_BYTES:
                return self._overflow([])
            return []
        *events, rest = bytes(self._buffer).split(b"\n\n")
        self._buffer = bytearray(rest)
        out = []
        for raw in events:
            event = self._take(raw)
            if event is not None:
                out.append(event + b"\n\n")
        if len(self._buffer) > MAX_EVENT_BYTES:
            return self._overflow(out)
        return out

    def _overflow(self, out: list[bytes]) -> list[bytes]:
        """Never hold more than one bounded event: pass the rest on untracked."""
        out.append(bytes(self._buffer))
        self._buffer, self.untracked = bytearray(), True
        return out

    def next_segment(self) -> None:
        """The stream broke: what comes next is a continuation."""
        self._buffer = bytearray()
        self.earlier_tokens = self.tokens
        self.segment += 1
        self.upstream_error = ""

    def _take(self, raw: bytes) -> bytes | None:
        line = raw.strip()
        if not line:
            return None
        if line == DONE:
            if self.upstream_error:  # vLLM ends a failed stream with its error and [DONE]:
                return None  # not an end, and the client must not take it for one
            self.done = True
            return line
        if not line.startswith(b"data:"):
            return raw
        try:
            event = loads(line[5:])
        except ValueError:
            return raw
        if not isinstance(event, dict):
            return raw
        if "error" in event:  # the plane's own "stream_broken": continue, do not pass it on
            self.upstream_error = engine_error(event["error"])
            return None
        choices = event.get("choices") or []
        piece = ""
        role_only = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self.finished = True
            if self.chat:
                delta = choice.get("delta") or {}
                if delta.get("tool_calls"):
                    self.tool_call = True
                if delta.get("reasoning_content") or delta.get("reasoning"):
                    self.reasoning = True
                content = delta.get("content")
                piece += content if isinstance(content, str) else ""
                role_only = "role" in delta and not content and not delta.get("tool_calls")
            else:
                text = choice.get("text")
                piece += text if isinstance(text, str) else ""
        usage = event.get("usage")
        if not isinstance(usage, dict):
            usage = None
        if piece and self._chars <= MAX_TRACKED_CHARS:
            self._chars += len(piece)
            if self._chars > MAX_TRACKED_CHARS:  # past any context: not continued, not kept
                self.text.clear()
            else:
                self.text.append(piece)
        if usage is not None and choices:  # the engine's running count
            self.tokens = self.earlier_tokens + _count(usage, "completion_tokens")
            if not self.segment and self.prompt_tokens is None:
                self.prompt_tokens = _count(usage, "prompt_tokens")
        elif piece:
            self.tokens += 1
        if self.segment and role_only and choices and not choices[0].get("finish_reason"):
            return None  # a continuation's opening role chunk: the client has had one
        if usage is None:
            return line
        if not self.usage_asked or (choices and not self.every_usage_asked):
            if not choices:
                return None  # the final usage chunk, which the client did not ask for
            del event["usage"]
        elif self.segment:
            event["usage"] = self._whole(usage)
        else:
            return line
        return b"data: " + json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()

    def _whole(self, usage: dict[str, Any]) -> dict[str, Any]:
        """Usage of the whole stream from a continuation's: its completion plus the earlier
        segments'; the first segment's prompt (else the continued prompt less the tokens it
        held from earlier segments)."""
        out = dict(usage)
        earlier = self.earlier_tokens
        prompt = self.prompt_tokens
        if prompt is None:
            prompt = max(_count(usage, "prompt_tokens") - earlier, 0)
        out["prompt_tokens"] = prompt
        out["completion_tokens"] = _count(usage, "completion_tokens") + earlier
        out["total_tokens"] = prompt + out["completion_tokens"]
        return out


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) else 0


def continuation(
    path: str, payload: dict[str, Any], tracker: StreamTracker
) -> dict[str, Any] | None:
    """The body that continues the stream (None: nothing is left to generate: the answer
    said why it stopped, or every token asked for was delivered)."""
    if tracker.finished:  # continued, it would answer twice (a second finish and usage)
        return None
    body = dict(payload)
    text, used = tracker.delivered, tracker.tokens
    chat = path.endswith("/chat/completions")
    # the limit the engine reads: chat's max_completion_tokens before max_tokens; a
    # completion's absent or null max_tokens is 16; 100.0 and "100" are 100 (vLLM coerces)
    key = (
        "max_completion_tokens"
        if chat and _tokens(payload.get("max_completion_tokens"))
        else "max_tokens"
    )
    limit = _tokens(payload.get(key))
    if limit is None and not chat:
        limit = 16
    if limit is not None:
        if limit - used <= 0:
            return None
        body[key] = limit - used
    floor = _tokens(payload.get("min_tokens"))
    if floor:  # at least that many in all, so fewer still to come
        body["min_tokens"] = max(floor - used, 0)
    if not text:
        return body
    if chat:
        messages = list(payload["messages"])
        last = messages[-1] if messages else None
        if (
            payload.get("continue_final_message")
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        ):
            messages[-1] = {**last, "content": last["content"] + text}
        else:
            messages.append({"role": "assistant", "content": text})
        body["messages"] = messages
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
        return body
    prompt = payload["prompt"]
    body["prompt"] = (prompt[0] if isinstance(prompt, list) else prompt) + text
    return body


def _tokens(value: Any) -> int | None:
    """A token count as the engine reads it (pydantic's lax int: 100, 100.0, "100"), or
    None (absent, null, not a whole number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def engine_error(error: object) -> str:
    """What the gateway keeps (logs, shows in /debug/routes) of an error event in a stream:
    its code or type and the length of its message, never the message, which an engine may
    fill with the request's or the answer's text."""
    if not isinstance(error, dict):
        return f"an error event ({len(str(error))} characters)"
    kind = str(error.get("code") or error.get("type") or "unnamed")[:64]
    kind = "".join(c if c.isprintable() else "?" for c in kind)
    message = error.get("message")
    size = len(message) if isinstance(message, str) else 0
    return f"an error event: {kind} ({size} characters of message)"
