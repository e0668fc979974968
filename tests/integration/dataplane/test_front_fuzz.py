"""Bad input never gives a 5xx or ends a process: the plane's HTTP front fuzzed (hypothesis)
against real processes — the router as its own process (``gpufleet router --state-dir``), an
agent running two engine-sim replicas as processes.

The requests are mutations of valid OpenAI requests: a field set to a JSON value of any type
(lone surrogates, NUL, huge and non-finite numbers, long strings, nesting, JSON the encoder
cannot write), fields dropped, unknown ones added; bodies cut short, not UTF-8, not JSON;
odd content types, request ids, priorities and keys; odd routes and methods; streams read to
their end. A table of raw-socket requests adds odd HTTP framing. Whatever a client sends to a
plane whose replicas are healthy, it may rely on:

- an answer, in time, and no 5xx;
- a 4xx is an OpenAI-shaped error, ``{"error": {"message": "<what to change>", "type": …}}``;
- an answer on an inference route carries ``x-request-id`` (the other routes log nothing);
- a 200 there is whole: a JSON object, or an SSE stream ending with ``data: [DONE]``;
- framing the server cannot trust (where would the next request start?) gets a plain
  ``400 bad request`` and the connection closed; headers over the limits get a 431;
- afterwards every process lives and a plain request gets its completion.

The run is derandomised (the same requests every time) and not shrunk (a dead process would
fail every shrink step): a failure lists each distinct problem with the first request that
showed it. ``tests/integration/gateway/test_gateway_fuzz.py`` sends the same to a gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httptools
import httpx
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from tests.integration.dataplane.conftest import make_sim_deployment
from tests.integration.dataplane.test_router_enginesim import DEEP_BODY, chat
from tests.integration.dataplane.test_router_process import apply, plane_agent, served
from tests.unit.workloadplane.test_enginesim_vllm_parity import BASES, FIELDS, ODD_VALUES

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

EXAMPLES = 300
TIMEOUT_S = 20.0
"""An answer later than this is a hang: the slowest valid one here takes well under 1 s."""
FAST_SIM = ["--tokens-per-s", "500", "--max-model-len", "256"]
"""Every completion is short (256 tokens at most, 500 a second), whatever max_tokens asks."""
INFERENCE = tuple(sorted(BASES))

# --- the requests ---------------------------------------------------------------------------
PIECES = ["\ud800", "\udc00\ud800", "\x00", "\ufeff", "\u202e", "😀", "²", "\r\n", '"', "\\", " "]
"""Of the strings sent: lone surrogates (a JSON escape carries them, UTF-8 cannot), NUL, ..."""
LONG = [300, 100_000]
"""Runs of x: 300 take a prompt past the router's prefix-affinity threshold (256)."""
RAW_VALUES = {"5000 digits": "1" * 5000, "3000 deep": "[" * 3000 + "]" * 3000, "1e999": "1e999",
              "-0": "-0", "NaN": "NaN", "-Infinity": "-Infinity"}  # fmt: skip
"""Field values as JSON text the encoder would not write: past int()'s 4,300 digits, past
the parser's nesting limit, ..."""
ODD_BODIES = {"empty": b"", "null": b"null", "list": b"[]", "string": b'"chat"', "zero": b"0",
              "open": b"{", "no model": b"{}", "200,000 deep": DEEP_BODY,
              "a BOM": b'\xef\xbb\xbf{"model": "chat", "prompt": "hi"}',
              "trailing text": b'{"model": "chat"} and more',
              "model twice": b'{"model": "chat", "model": 7, "prompt": "x"}',
              "trailing NUL": b'{"model": "chat", "prompt": "x"}\x00'}  # fmt: skip
ODD_ROUTES = [("GET", "/v1/chat/completions"), ("PUT", "/v1/completions"),
              ("DELETE", "/v1/embeddings"), ("PATCH", "/v1/chat/completions"),
              ("OPTIONS", "/v1/completions"), ("HEAD", "/v1/chat/completions"),
              ("POST", "/v1/chat/completions/"), ("POST", "/V1/completions"),
              ("POST", "//v1/completions"), ("POST", "/v1/models"), ("POST", "/health"),
              ("POST", "/v1/chat%2Fcompletions"), ("POST", "/v1/completions%00"),
              ("POST", "/%ff%fe"), ("POST", "/"), ("POST", "/v1/completions?stream=true"),
              ("GET", "/v1/models?model=%ff"), ("GET", "/health"), ("GET", "/metrics"),
              ("GET", "/internal/load"), ("GET", "/debug/routes?model=chat"),
              ("GET", "/debug/routes?model=%ff&region=%00&jurisdiction=,,")]  # fmt: skip
ODD_HEADER_VALUES = [b"\xc2\xb2", b"9" * 5000, b"-1", b"0", b"high", b"LOW", b"1e3", b"\xd9\xa3",
                     b"\xff\xfe", b"", b"Bearer", b"Bearer \xff", b"Bearer  x"]  # fmt: skip
"""``²`` is a digit to ``str.isdigit`` and not to ``int()``; Arabic-Indic 3 is one to both."""
NOT_UTF8 = [b"\xff", b"\xc3", b"\xed\xa0\x80"]
"""Bytes no UTF-8 text has: the last is a lone surrogate (which ``json.loads`` reads)."""
CONTENT_TYPES = [b"application/json", b"text/plain", b"", b"application/x-www-form-urlencoded",
                 b"\xff", b"multipart/form-data; boundary=x", b"application/json; charset=utf-16"]  # fmt: skip

texts = st.lists(
    st.sampled_from(PIECES) | st.text(max_size=12) | st.sampled_from(LONG).map(lambda n: "x" * n),
    max_size=4,
).map("".join)
numbers = st.integers() | st.floats() | st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**100])
values = st.recursive(
    st.none() | st.booleans() | numbers | texts | st.sampled_from(ODD_VALUES),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(texts, kids, max_size=3),
    max_leaves=8,
)
header_values = st.sampled_from(ODD_HEADER_VALUES) | st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if 0x21 <= c != 0x7F)  # what an HTTP client may send
)
HEADERS: dict[str, st.SearchStrategy[bytes]] = {
    "x-request-id": header_values,
    "x-priority": header_values,
    "authorization": header_values,
    "content-type": st.sampled_from(CONTENT_TYPES),
    "accept": st.sampled_from([b"text/event-stream", b"application/xml", b"*/*"]),
}
"""The headers the front reads, and one it should not care about."""


@dataclass(frozen=True)
class Probe:
    method: str
    path: str
    headers: tuple[tuple[str, bytes], ...]
    body: bytes

    @property
    def inference(self) -> bool:
        return self.method == "POST" and self.path.partition("?")[0] in INFERENCE

    def __repr__(self) -> str:  # what a failure shows: the request, a long body cut
        body = self.body if len(self.body) <= 400 else self.body[:400] + b"..."
        return f"{self.method} {self.path} {dict(self.headers)} ({len(self.body)} bytes) {body!r}"


def encoded(payload: dict[str, Any], raw: Mapping[str, str], ascii_only: bool = True) -> bytes:
    """``payload`` as JSON, then ``raw``'s fields as the JSON text given (a key repeated:
    the last one counts); not ``ascii_only``, a lone surrogate is the invalid UTF-8 it
    would be (surrogatepass)."""
    text = json.dumps(payload, ensure_ascii=ascii_only)
    for name, value in raw.items():
        head = text[:-1].rstrip()
        text = f"{head}{'' if head.endswith('{') else ', '}{json.dumps(name)}: {value}}}"
    return text.encode("utf-8", "surrogatepass")


@st.composite
def payloads(draw: st.DrawFn, route: str, kept: frozenset[str]) -> bytes:
    """A valid request body for ``route`` (its text drawn), mostly streamed, then up to
    three fields set, set to raw JSON text or dropped (never the ``kept`` ones)."""
    payload: dict[str, Any] = {**BASES[route], "model": "chat"}
    text = draw(texts)
    if "messages" in payload:
        payload["messages"] = [{"role": "user", "content": text}]
    else:
        payload["prompt" if "prompt" in payload else "input"] = text
    if draw(st.sampled_from([True, True, False])):
        payload["stream"] = True
    raw: dict[str, str] = {}
    fields = st.sampled_from(sorted(payload)) | st.sampled_from(FIELDS) | texts
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):  # some left valid, to be served
        name = draw(fields.filter(lambda name: name not in kept))
        how = draw(st.sampled_from(["set", "set", "drop", "raw"]))
        if how == "drop":
            payload.pop(name, None)
        elif how == "raw":
            raw[name] = RAW_VALUES[draw(st.sampled_from(sorted(RAW_VALUES)))]
        else:
            payload[name] = draw(values)
    return encoded(payload, raw, ascii_only=draw(st.booleans()))


@st.composite
def mangled(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` (mostly), or it cut short, made invalid UTF-8, random bytes, an odd body."""
    match draw(st.sampled_from(["as is"] * 6 + ["cut", "not utf-8", "bytes", "odd"])):
        case "cut":
            return body[: draw(st.integers(0, max(len(body) - 1, 0)))]
        case "not utf-8":
            at, bad = draw(st.integers(0, len(body))), draw(st.sampled_from(NOT_UTF8))
            return body[:at] + bad + body[at:]
        case "bytes":
            return draw(st.binary(max_size=200))
        case "odd":
            return ODD_BODIES[draw(st.sampled_from(sorted(ODD_BODIES)))]
    return body


@st.composite
def probes(
    draw: st.DrawFn,
    kept: frozenset[str] = frozenset(),
    headers: Mapping[str, st.SearchStrategy[bytes]] = HEADERS,
) -> Probe:
    """A mangled request to an inference route (one in seven to an odd route instead),
    with up to three of ``headers``."""
    route = draw(st.sampled_from(INFERENCE))
    body = draw(mangled(draw(payloads(route, kept))))
    method = "POST"
    if draw(st.sampled_from([False] * 6 + [True])):
        method, route = draw(st.sampled_from(ODD_ROUTES))
    chosen = draw(st.lists(st.sampled_from(sorted(headers)), max_size=3, unique=True))
    return Probe(method, route, tuple((n, draw(headers[n])) for n in chosen), body)


# --- what a client would notice ---------------------------------------------------------------
def _json(body: bytes | str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def openai_error(body: bytes) -> bool:
    """``{"error": {"message": a non-empty string, "type": a non-empty string, ...}}``."""
    parsed = _json(body)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"].strip())
        and isinstance(error.get("type"), str)
        and bool(error["type"])
    )


def whole_stream(text: str) -> bool:
    """JSON events, none an error, then ``data: [DONE]``."""
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return (
        bool(events)
        and events[-1] == "[DONE]"
        and all(isinstance(e := _json(event), dict) and "error" not in e for event in events[:-1])
    )


def problems(probe: Probe, answer: httpx.Response) -> list[str]:
    """What a client would notice about ``answer`` to ``probe`` (nothing: [])."""
    status = answer.status_code
    if status != 200 and not 400 <= status < 500:
        return [f"status {status}"]
    found = []
    if probe.inference and not answer.headers.get("x-request-id"):
        found.append("no x-request-id")
    if status >= 400 and probe.method != "HEAD" and not openai_error(answer.content):
        found.append(f"a {status} that is not an OpenAI-shaped error")
    if status == 200 and probe.inference:
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            if not whole_stream(answer.text):
                found.append("a stream that does not end with data: [DONE]")
        elif not isinstance(_json(answer.content), dict):
            found.append("a 200 that is not a JSON object")
    return found


@dataclass
class Run:
    """Each distinct problem once (with its first request), and how the requests were
    answered: a run that proves little shows."""

    failures: dict[str, str] = field(default_factory=dict)
    statuses: Counter[int] = field(default_factory=Counter)
    streams: int = 0

    def check(self, examples: int) -> None:
        failures = list(self.failures.values())
        assert not failures, f"{len(failures)} distinct problems:\n\n" + "\n\n".join(failures)
        refused = sum(n for status, n in self.statuses.items() if 400 <= status < 500)
        assert self.statuses[200] > examples // 10 and refused > examples // 3, self
        assert self.streams >= 5, self


def fuzz(
    url: str,
    strategy: st.SearchStrategy[Probe],
    examples: int,
    judge: Callable[[Probe, httpx.Response], list[str]] = problems,
    explicit: Sequence[Probe] = (),
) -> Run:
    """Send ``explicit``, then ``examples`` requests drawn from ``strategy``, one at a time."""
    run = Run()
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:

        @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate])  # fmt: skip
        @given(probe=strategy)
        def send(probe: Probe) -> None:
            headers = [(name.encode(), value) for name, value in probe.headers]
            try:
                answer = client.request(probe.method, probe.path, headers=headers,
                                        content=probe.body)  # fmt: skip
            except httpx.HTTPError as exc:
                found, said = [f"no answer ({type(exc).__name__})"], repr(exc)
            else:
                found, said = judge(probe, answer), f"{answer.status_code} {answer.text[:300]}"
                run.statuses[answer.status_code] += 1
                sse = answer.headers.get("content-type", "").startswith("text/event-stream")
                run.streams += sse and answer.status_code == 200
            for problem in found:
                key = f"{problem} on {probe.method} {probe.path.partition('?')[0]}"
                run.failures.setdefault(key, f"{key}:\n  {probe!r}\n  -> {said}")

        for probe in explicit:
            send = example(probe=probe)(send)
        send()
    return run


# --- HTTP framing, on raw sockets ---------------------------------------------------------------
@dataclass
class RawAnswer:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""


class _Answers:
    """The responses in what came back on one connection (httptools' parser)."""

    def __init__(self, data: bytes) -> None:
        self.list: list[RawAnswer] = []
        self._parser = httptools.HttpResponseParser(self)
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.list.append(RawAnswer())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.list[-1].headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.list[-1].status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.list[-1].body += body


def framing(answers: list[RawAnswer]) -> bool:
    """Where the next request starts is unknown: a plain 400 (the connection closed)."""
    return [(a.status, a.body) for a in answers] == [(400, b"bad request")]


def over_limit(code: str) -> Callable[[list[RawAnswer]], bool]:
    def expect(answers: list[RawAnswer]) -> bool:
        bodies = [a.body for a in answers if a.status == 431]
        return (
            len(answers) == len(bodies) == 1
            and openai_error(bodies[0])
            and code in bodies[0].decode()
        )

    return expect


def completed(answers: list[RawAnswer]) -> bool:
    one = answers[0] if len(answers) == 1 else RawAnswer()
    return one.status == 200 and b"x-request-id" in one.headers and "choices" in _json(one.body)


def in_order(answers: list[RawAnswer]) -> bool:
    seen = [(a.status, a.headers.get(b"x-request-id")) for a in answers]
    return seen[:2] == [(200, b"p1"), (400, b"p2")] and [s for s, _ in seen[2:]] == [404]


BODY = json.dumps(chat(max_tokens=2)).encode()
CL, CLOSE = b"Content-Length: %d" % len(BODY), b"Connection: close"


def post(*headers: bytes, body: bytes = BODY) -> bytes:
    head = [b"POST /v1/chat/completions HTTP/1.1", b"Host: fuzz", *headers, b"", b""]
    return b"\r\n".join(head) + body


def chunked(body: bytes) -> bytes:
    return b"a\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (body[:10], len(body) - 10, body[10:])


RAW_CASES: list[tuple[str, list[bytes], Callable[[list[RawAnswer]], bool]]] = [
    ("a repeated content-length", [post(CL, CL)], framing),
    ("two content-lengths", [post(CL, b"Content-Length: 5")], framing),
    ("content-length and chunked",
     [post(b"Content-Length: 5", b"Transfer-Encoding: chunked", body=chunked(BODY))], framing),
    ("a chunk size not in hex", [post(b"Transfer-Encoding: chunked", body=b"zz\r\nab\r\n")],
     framing),
    ("a negative content-length", [post(b"Content-Length: -1")], framing),
    ("a content-length past 2**64", [post(b"Content-Length: " + b"9" * 30)], framing),
    ("NUL in a header", [post(CL, b"X-A: a\x00b")], framing),
    ("an unknown method", [b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n"], framing),
    ("TLS to a plain port", [b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(32)], framing),
    ("a 70 KiB header line", [post(CL, b"X-Long: " + b"a" * 70_000)],
     over_limit("headers_too_large")),
    ("150 headers", [post(CL, *(b"X-%d: y" % i for i in range(150)))],
     over_limit("too_many_headers")),
    ("a chunked body", [post(b"Transfer-Encoding: chunked", CLOSE, body=chunked(BODY))],
     completed),
    ("expect 100-continue", [post(CL, b"Expect: 100-continue", CLOSE)], completed),
    ("HTTP/1.0 without a host",
     [b"POST /v1/chat/completions HTTP/1.0\r\n%b\r\n\r\n%b" % (CL, BODY)], completed),
    ("a body slower than its content-length", [post(CL, CLOSE, body=BODY[:10]), BODY[10:]],
     completed),
    ("a body shorter than its content-length, then gone", [post(b"Content-Length: 999"), b""],
     lambda answers: not answers),
    ("three pipelined requests",
     [post(CL, b"X-Request-Id: p1") + post(b"Content-Length: 5", b"X-Request-Id: p2", body=b"{nope")
      + b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"], in_order),
]  # fmt: skip
"""(what, the parts sent, what the answers must be): between two parts nothing may come
back within ``PAUSE_S``; an empty last part hangs up instead. Every case but that one must
end with the server closing the connection."""
PAUSE_S = 0.3


def exchange(port: int, parts: list[bytes]) -> tuple[list[RawAnswer], str]:
    """Send ``parts``; (the final answers, what went against the rules of ``RAW_CASES``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        for part in parts[:-1]:
            sock.sendall(part)
            sock.settimeout(PAUSE_S)
            with contextlib.suppress(TimeoutError):
                if early := sock.recv(65536):
                    return _Answers(early).list, "answered before the request was whole"
            sock.settimeout(TIMEOUT_S)
        if not parts[-1]:
            return [], ""
        sock.sendall(parts[-1])
        data = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
            return [a for a in _Answers(data).list if a.status >= 200], ""  # not 100 Continue
    return _Answers(data).list, "the connection was left open"


def raw_problems(port: int) -> list[str]:
    """Each of ``RAW_CASES`` that was not answered as it expects."""
    found = []
    for what, parts, expect in RAW_CASES:
        try:
            answers, wrong = exchange(port, parts)
        except (OSError, httptools.HttpParserError) as exc:
            found.append(f"{what}: {exc!r}")
            continue
        if wrong or not expect(answers):
            seen = [(a.status, a.body[:200]) for a in answers]
            found.append(f"{what}: {wrong or 'not the answer expected'}; got {seen}")
    return found


# --- the plane ------------------------------------------------------------------------------------
ONCE_WRONG = [
    Probe("POST", "/v1/chat/completions", (("x-priority", "²".encode()),), BODY),
    Probe("POST", "/v1/completions", (), b'{"model": "chat", "prompt": "\\ud800%b"}' % (b"x" * 300)),
    Probe("POST", "/v1/embeddings", (), b'{"model": "chat", "input": "\xed\xa0\x80"}'),
    Probe("POST", "/v1/embeddings", (), b'{"model": "chat", "input": "", "stream": true}'),
]  # fmt: skip
"""Requests answered wrongly once, sent first whatever is drawn: 500s for a priority that is
no number, a lone surrogate in a prompt the router hashes, one as UTF-8 bytes (engine-sim);
a stream asked of embeddings, answered in JSON, lost at the gateway."""


async def routed(url: str, replicas: int, timeout_s: float = 60) -> None:
    """The router process routes to ``replicas`` ready replicas of chat (bounded wait)."""
    line = f'gpufleet_router_replicas{{deployment="chat",phase="active"}} {float(replicas)}'
    async with httpx.AsyncClient(timeout=10) as client, asyncio.timeout(timeout_s):
        while line not in (await client.get(f"{url}/metrics")).text:
            await asyncio.sleep(0.1)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 0)
        return True
    return False


async def test_no_request_gets_a_5xx_from_the_router_or_ends_a_process(router_process):
    state, port = router_process
    url = f"http://127.0.0.1:{port}"
    async with plane_agent(state, port) as plane:
        await apply(plane, 1, make_sim_deployment(replicas=2, engine_args=FAST_SIM))
        await routed(url, 2)  # two: the prefix-affinity hash runs only when there is a choice
        pids = {r.replica_id: plane.runtime.pid(r.replica_id)
                for r in await plane.runtime.list_replicas()}  # fmt: skip
        started = time.monotonic()
        run = await asyncio.to_thread(fuzz, url, probes(), EXAMPLES, problems, ONCE_WRONG)
        framed = await asyncio.to_thread(raw_problems, port)
        took = time.monotonic() - started
        still = await served(url)
        now = {r: plane.runtime.pid(r) for r in pids}
    run.check(EXAMPLES)
    assert not framed, "\n".join(framed)
    assert still, "the router process no longer answers a plain request"
    assert now == pids and all(map(alive, pids.values())), f"replicas were {pids}, now {now}"
    print(f"{EXAMPLES} requests and {len(RAW_CASES)} raw ones in {took:.1f} s: {run}")
