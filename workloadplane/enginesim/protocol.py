"""OpenAI-compatible request parsing and response shapes, as vLLM's server writes them."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from typing import Any, Literal, TypeVar

from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from controlplane.contracts import loads
from workloadplane.enginesim.engine import continued, count_tokens, split_continuation

_M = TypeVar("_M", bound=BaseModel)

# Tokens a chat template adds around each message, and before the reply.
TOKENS_PER_MESSAGE = 4
TOKENS_FOR_REPLY = 2


class ApiError(Exception):
    """An error the client can fix; rendered as ``{"error": {message, type, param, code}}``."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param
        self.kind = kind or {
            400: "BadRequestError",
            404: "NotFoundError",
            503: "ServiceUnavailableError",
        }.get(status, "InternalServerError")

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }
        try:
            return JSONResponse(body, status_code=self.status)
        except UnicodeEncodeError as exc:  # a lone surrogate echoed (a model name): as vLLM
            return ApiError(str(exc)).response()


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # so that any key makes it "set" (vLLM: truthy)
    include_usage: bool = False
    continuous_usage_stats: bool = False


def invalid_param(message: str, parameter: str | None = None, value: object = None) -> ApiError:
    """vLLM's ``VLLMValidationError`` as its server renders it: 400 ``BadRequestError``, the
    message followed by ``(parameter=…, value=…)`` for the parts it names."""
    named = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value)) if v is not None]
    return ApiError(f"{message} ({', '.join(named)})" if named else message, param=parameter)


INT64 = 2**63
MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""
VOCABULARY = 32_000
"""What ``-1`` (every token) means for logprobs here: a Llama-sized vocabulary."""


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]


class _Request(BaseModel):
    """The fields vLLM 0.32's request models type, typed alike (a value of the wrong type
    is its 400); the others are accepted and ignored, as there."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    n: int = 1
    seed: int | None = Field(default=None, ge=-INT64, le=INT64 - 1)
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    echo: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    use_beam_search: bool = False
    priority: int = 0
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=INT64 - 1)
    prompt_logprobs: Any = None  # checked by hand, as vLLM does
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    # Sampling parameters: engine-sim ignores their effect but checks them as vLLM does.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0

    @field_validator("stream", mode="before")
    @classmethod
    def _null_stream_is_unstreamed(cls, value: object) -> object:
        return False if value is None else value  # vLLM: `stream: bool | None = False`

    def check(self, max_model_len: int) -> None:
        """vLLM's semantic checks, with its messages."""
        self.check_extras(max_model_len)
        # vLLM tests the dict's truth: an empty `stream_options` passes unstreamed
        if (
            self.stream_options is not None
            and (self.stream_options.model_fields_set or self.stream_options.model_extra)
            and not self.stream
        ):
            raise ApiError(
                "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                param="stream_options",
            )
        wanted = self.requested_max_tokens()
        if wanted is not None and wanted > max_model_len:
            raise ApiError(
                f"max_tokens={wanted} cannot be greater than max_model_len={max_model_len}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={wanted})",
                param="max_tokens",
            )
        self.check_sampling(wanted)
        if self.n != 1:
            raise ApiError("engine-sim generates one choice per prompt; set n to 1", param="n")

    def check_extras(self, max_model_len: int) -> None:
        """vLLM's checks of the fields it types but engine-sim does not act on."""
        _check_logprobs("prompt_logprobs", "prompt", self.prompt_logprobs, bool(self.stream))
        if self.logit_bias:
            bad = [k for k in self.logit_bias if not _is_int(k)]
            if bad:
                raise invalid_param(
                    "logit_bias contains key(s) that cannot be converted to integer token IDs: "
                    f"{bad}",
                    "logit_bias",
                    bad,
                )
        cut = self.truncate_prompt_tokens
        if cut == 0:
            raise ApiError("The decoder prompt cannot be empty")
        if cut is not None and cut > max_model_len:
            raise invalid_param(
                f"truncate_prompt_tokens value ({cut}) is greater than max_model_len "
                f"({max_model_len}). Please request a smaller truncation size.",
                "truncate_prompt_tokens",
                cut,
            )

    def check_sampling(self, max_tokens: int | None) -> None:
        """vLLM 0.32's ``SamplingParams._verify_args``, in its order, with its messages; an
        unset parameter takes vLLM's default, which passes."""
        if self.n < 1:
            raise invalid_param(f"n must be at least 1, got {self.n}.")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not -2.0 <= value <= 2.0:
                raise invalid_param(f"{name} must be in [-2, 2], got {value}.")
        rep = self.repetition_penalty
        if rep is not None and not math.isfinite(rep):
            raise invalid_param(f"repetition_penalty must be a finite number, got {rep}.")
        if rep is not None and rep <= 0.0:
            raise invalid_param(f"repetition_penalty must be greater than zero, got {rep}.")
        t = self.temperature
        if t is not None:
            if not math.isfinite(t):
                raise invalid_param(
                    f"temperature must be a finite number, got {t}.", "temperature", t
                )
            if t < 0.0:
                raise invalid_param(f"temperature must be non-negative, got {t}.", "temperature", t)
            if t > 2.0:
                raise invalid_param(f"temperature must be in [0, 2], got {t}.", "temperature", t)
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise invalid_param(f"top_p must be in (0, 1], got {self.top_p}.", "top_p", self.top_p)
        if self.top_k is not None and self.top_k < -1:  # vLLM quietly accepts -1 as disabled
            raise invalid_param(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise invalid_param(f"min_p must be in [0, 1], got {self.min_p}.")
        if max_tokens is not None and max_tokens < 1:
            raise invalid_param(
                f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
            )
        if self.min_tokens < 0:
            raise invalid_param(
                f"min_tokens must be greater than or equal to 0, got {self.min_tokens}."
            )
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise invalid_param(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                f"got {self.min_tokens}."
            )
        if any(not s for s in self.stops):
            raise invalid_param("stop cannot contain an empty string.")

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def _is_int(key: str) -> bool:
    try:
        int(key)
    except ValueError:
        return False
    return True


def _check_logprobs(name: str, what: str, value: object, stream: bool) -> None:
    """vLLM's checks of ``logprobs`` (completions) and ``prompt_logprobs``: an integer, -1
    (every token) or 0..MAX_LOGPROBS."""
    if value is None:
        return
    if not isinstance(value, int):  # a bool is one (Python's, and so vLLM's)
        raise invalid_param(f"`{name}` must be an integer.", name, value)
    if name == "prompt_logprobs" and stream and (value > 0 or value == -1):
        raise invalid_param("`prompt_logprobs` are not available when `stream=True`.", name)
    if value < 0 and value != -1:
        raise invalid_param(f"`{name}` must be a positive value or -1.", name, value)
    wanted = VOCABULARY if value == -1 else value
    if wanted > MAX_LOGPROBS:
        raise invalid_param(
            f"Requested {what} logprobs of {wanted}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            name,
            wanted,
        )


TEXT_PART_TYPES = {"text", "refusal", "thinking"}
OTHER_PART_TYPES = {  # vLLM 0.32's chat content parts besides text (engine-sim ignores them)
    "image_url", "input_audio", "file", "audio_url", "video_url", "image_embeds",
    "audio_embeds", "video_embeds", "prompt_embeds", "image_pil", "tool_reference",
}  # fmt: skip


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in TEXT_PART_TYPES | OTHER_PART_TYPES:
            raise ValueError(f"Unknown part type: {value}")
        return value

    @model_validator(mode="after")
    def _text_has_text(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs `text`")
        return self


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text or "" for p in self.content if p.type == "text")


class ChatRequest(_Request):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = "none"

    continue_final_message: bool = False
    add_generation_prompt: bool = True

    @field_validator("n", mode="before")
    @classmethod
    def _null_n_is_one(cls, value: object) -> object:
        return 1 if value is None else value  # vLLM: chat's `n: int | None = 1`

    def check(self, max_model_len: int) -> None:
        if not self.messages:
            raise ApiError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        if self.continue_final_message and self.add_generation_prompt:
            raise ApiError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ApiError(
                "continue_final_message requires the final message to be from the assistant",
                param="messages",
            )
        if self.tools is not None and not self.tools:
            raise invalid_param(
                "`tools` must not be an empty array. Either provide at least one tool or omit "
                "the field entirely.",
                "tools",
            )
        if self.tool_choice not in (None, "none") and not self.tools:
            raise invalid_param("When using `tool_choice`, `tools` must be set.", "tool_choice")
        top = self.top_logprobs
        if top and not self.logprobs:
            raise invalid_param(
                "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        _check_logprobs("top_logprobs", "sample", top, False)
        _Request.check(self, max_model_len)

    def continued(self) -> tuple[str, int, int]:
        """(seed, prompt tokens, offset): with ``continue_final_message`` and a final
        assistant message that is the start of engine-sim's own answer, generation picks up
        where that answer was (offset = its tokens; the prompt holds them), as vLLM with a
        greedy model would; otherwise the whole conversation seeds a new answer."""
        if self.continue_final_message and len(self.messages) > 1:
            head = self.messages[:-1]
            seed = "\n".join(f"{m.role}:{m.text()}" for m in head)
            offset = continued(seed, self.messages[-1].text())
            if offset is not None:
                return seed, _chat_tokens(head) + offset, offset
        return self.prompt_seed(), self.prompt_tokens(), 0

    def prompt_tokens(self) -> int:
        return _chat_tokens(self.messages)

    def prompt_seed(self) -> str:
        return "\n".join(f"{m.role}:{m.text()}" for m in self.messages)

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


def _chat_tokens(messages: list[Message]) -> int:
    return TOKENS_FOR_REPLY + sum(TOKENS_PER_MESSAGE + count_tokens(m.text()) for m in messages)


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: Any = None  # checked by hand, as vLLM does
    echo: bool | None = False  # vLLM: optional here, not in chat

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _null_is_16(cls, value: Any) -> Any:
        """vLLM's `normalize_null_max_tokens`: an explicit null is the default 16 (it was the
        whole context here)."""
        return 16 if value is None else value

    def check(self, max_model_len: int) -> None:
        _check_logprobs("logprobs", "sample", self.logprobs, False)
        p = self.prompt
        if p == "" or (isinstance(p, list) and any(x == "" or x == [] for x in p)):
            raise ApiError("The decoder prompt cannot be empty")
        _Request.check(self, max_model_len)

    def prompts(self) -> list[tuple[str, int]]:
        """(seed, prompt tokens) for each prompt in the request."""
        p = self.prompt
        if isinstance(p, str):
            return [(p, count_tokens(p))]
        return self._many(p)

    def continued(self) -> tuple[str, int, int]:
        """(seed, prompt tokens, offset) of a one-string prompt: a prompt ending with the
        start of engine-sim's own answer to a shorter prompt continues that answer (a
        greedy model continues its own text), else it seeds a new one."""
        p = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        assert isinstance(p, str)
        base, offset = split_continuation(p, limit=512)
        return base, count_tokens(base) + offset, offset

    def _many(self, p: list[str] | list[int] | list[list[int]]) -> list[tuple[str, int]]:
        if not p:
            raise ApiError("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [(json.dumps(p), len(p))]
        if all(isinstance(x, str) for x in p):
            return [(s, count_tokens(s)) for s in p if isinstance(s, str)]
        return [(json.dumps(x), len(x)) for x in p if isinstance(x, list)]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = Field(default=None, ge=1)


def parse(model: type[_M], raw: bytes) -> _M:
    """Parse a JSON body into ``model`` or raise an ApiError that says what to fix."""
    try:
        data = loads(raw or b"null")
    except json.JSONDecodeError as exc:
        raise _invalid("body", f"JSON decode error: {exc.msg} at char {exc.pos}") from exc
    except ValueError as exc:  # not UTF-8, or nested too deeply
        raise _invalid("body", f"JSON decode error: {exc}") from exc
    if not isinstance(data, dict):
        raise _invalid("body", "Input should be a JSON object")
    if _SURROGATE.search(raw) and not _encodable({k: v for k, v in data.items() if k != "model"}):
        raise ApiError(TEXT_ENCODE_INPUT)  # vLLM's tokenizer refuses a lone surrogate
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(["body", *(str(x) for x in first["loc"])])
        raise _invalid(where, first["msg"], len(exc.errors())) from exc


TEXT_ENCODE_INPUT = (
    "TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"
)
"""vLLM 0.32's 400 for text it cannot encode (its tokenizer's message), param null."""


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
"""A JSON escape of a surrogate, or one written as UTF-8 would write it (invalid UTF-8, but
``json.loads`` reads bytes with ``surrogatepass``: that was a 500): the only ways a body's
text can hold one, so the costly check below runs only for the bodies that have one (pairs,
emoji, included)."""


def _encodable(data: object) -> bool:
    """Every string in ``data`` is valid Unicode: no lone surrogate, which a JSON escape
    can carry and UTF-8 cannot."""
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def _invalid(where: str, message: str, count: int = 1) -> ApiError:
    """Structural errors, shaped like vLLM's request-validation handler (type "Bad Request")."""
    plural = "s" if count > 1 else ""
    return ApiError(
        f"{count} validation error{plural}:\n  {where}: {message}", param=where, kind="Bad Request"
    )


def new_id(prefix: str, request_id: str | None = None) -> str:
    return f"{prefix}-{request_id or uuid.uuid4().hex[:16]}"


def now_s() -> int:
    return int(time.time())


def usage(prompt: int, completion: int, details: bool = True) -> dict[str, Any]:
    """vLLM's usage block; streamed usage chunks leave out the details."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        out |= {"prompt_tokens_details": None, "completion_tokens_details": None}
    return out


def sse(payload: dict[str, Any] | str) -> bytes:
    body = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {body}\n\n".encode()
