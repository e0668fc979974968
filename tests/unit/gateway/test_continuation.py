"""Mid-stream failover, the pure part: events split whole, the text delivered, the
continued request (vLLM's parameters), the summed usage, and what cannot be continued."""

from __future__ import annotations

import json

from workloadplane.enginesim.engine import continued, split_continuation, token_text
from workloadplane.gateway.continuation import (
    StreamTracker,
    continuation,
    counted,
    not_continuable,
)

CHAT = "/v1/chat/completions"


def event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def delta(text: str | None = None, **extra: object) -> bytes:
    d: dict[str, object] = dict(extra)
    if text is not None:
        d["content"] = text
    return event({"choices": [{"index": 0, "delta": d, "finish_reason": None}]})


def test_partial_events_wait_and_a_broken_tail_is_never_sent():
    t = StreamTracker(chat=True)
    raw = delta(role="assistant", text="") + delta(" hello") + delta(" world")
    assert len(t.feed(raw[:-20])) == 2
    t.next_segment()  # the plane died: the half event is dropped
    assert t.delivered == " hello" and t.tokens == 1


def test_continuation_drops_its_role_chunk_and_sums_usage():
    t = StreamTracker(chat=True)
    t.feed(delta(role="assistant", text="") + delta(" a") + delta(" b"))
    t.next_segment()
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    out = t.feed(delta(role="assistant", text="") + delta(" c")
                 + event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")  # fmt: skip
    assert len(out) == 3 and t.done
    final = json.loads(out[1][6:])
    assert final["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_chat_continues_as_a_final_assistant_message_with_fewer_tokens():
    t = StreamTracker(chat=True)
    t.feed(delta(" a") + delta(" b"))
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    body = continuation(CHAT, payload, t)
    assert body is not None
    assert body["messages"][-1] == {"role": "assistant", "content": " a b"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8
    t2 = StreamTracker(chat=True)
    t2.feed(delta(" a") + delta(" b"))
    assert continuation(CHAT, {**payload, "max_tokens": 2}, t2) is None  # all delivered


def test_completions_continue_from_prompt_plus_text():
    t = StreamTracker(chat=False)
    t.feed(event({"choices": [{"index": 0, "text": " x"}]}))
    body = continuation("/v1/completions", {"model": "m", "prompt": "say", "max_tokens": 5}, t)
    assert body is not None and body["prompt"] == "say x" and body["max_tokens"] == 4


def test_what_cannot_be_continued():
    assert not_continuable(CHAT, {"messages": [{}], "n": 2})
    assert not_continuable("/v1/completions", {"prompt": [1, 2, 3]})
    assert not_continuable("/v1/completions", {"prompt": "x", "echo": True})
    assert not_continuable(CHAT, {"messages": [{"role": "user"}]}) == ""
    t = StreamTracker(chat=True)
    t.feed(delta(tool_calls=[{"index": 0, "function": {"name": "f"}}]))
    assert t.tool_call


def test_enginesim_continues_its_own_answer_exactly():
    seed = "user:hi"
    answer = "".join(token_text(seed, i) for i in range(5))
    assert continued(seed, answer) == 5
    assert continued(seed, answer + " nope") is None
    prompt = "once upon"
    told = "".join(token_text(prompt, i) for i in range(7))
    assert split_continuation(prompt + told) == (prompt, 7)


def test_a_planes_own_stream_error_is_not_passed_on_but_continued():
    t = StreamTracker(chat=True)
    error = {
        "error": {"message": "replica died", "type": "upstream_error", "code": "stream_broken"}
    }
    assert t.feed(delta(" a") + event(error)) == [delta(" a")]
    assert t.upstream_error == "an error event: stream_broken (12 characters of message)"
    assert not t.done


def test_an_event_over_the_bound_is_relayed_untracked_and_not_continued():
    from workloadplane.gateway.continuation import MAX_EVENT_BYTES

    t = StreamTracker(chat=True)
    t.feed(delta(" a"))
    huge = b"data: " + b"x" * (MAX_EVENT_BYTES + 1)
    out = t.feed(huge)
    assert b"".join(out) == huge and t._buffer == b""  # passed on, nothing held
    assert t.why_not.startswith("an event was over")


def running(text: str | None, prompt: int, completion: int, **extra: object) -> bytes:
    """A chunk with the engine's running usage (``continuous_usage_stats``)."""
    d: dict[str, object] = dict(extra)
    if text is not None:
        d["content"] = text
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}  # fmt: skip
    return event({"choices": [{"index": 0, "delta": d, "finish_reason": None}], "usage": usage})


def test_the_engine_is_asked_for_its_running_token_counts():
    payload = {"model": "m", "stream_options": {"include_usage": False, "x": 1}}
    assert counted(payload)["stream_options"] == {
        "include_usage": True, "continuous_usage_stats": True, "x": 1
    }  # fmt: skip
    assert counted({"model": "m"})["stream_options"]["continuous_usage_stats"] is True
    assert payload["stream_options"] == {"include_usage": False, "x": 1}  # not changed


def test_tokens_are_the_engines_count_not_chunks():
    """Real vLLM: a chunk with no text (a token ending inside a UTF-8 character) and a
    chunk of three tokens (its API server fell behind) are four tokens, not one chunk."""
    t = StreamTracker.of(CHAT, {"stream_options": {"include_usage": True}})
    t.feed(running("", 7, 0, role="assistant") + running(" a", 7, 1) + running("", 7, 2)
           + running(" bé", 7, 3) + running(" cde", 7, 6))  # fmt: skip
    assert t.tokens == 6 and t.prompt_tokens == 7 and t.delivered == " a bé cde"
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    body = continuation(CHAT, counted(payload), t)
    assert body is not None and body["max_tokens"] == 4


def test_running_usage_the_client_did_not_ask_for_is_taken_out():
    t = StreamTracker.of(CHAT, {})
    out = t.feed(running(" a", 7, 1) + event({"choices": [], "usage": {"prompt_tokens": 7}})
                 + b"data: [DONE]\n\n")  # fmt: skip
    assert [json.loads(e[6:]) for e in out[:-1]] == [
        {"choices": [{"index": 0, "delta": {"content": " a"}, "finish_reason": None}]}
    ]
    assert out[-1] == b"data: [DONE]\n\n" and t.tokens == 1


def test_the_whole_streams_usage_has_the_first_prompt_and_every_completion_token():
    """The continued prompt (8 + the 3 tokens delivered, re-tokenized as 2) is not what
    the client sent: its prompt is the first segment's count."""
    t = StreamTracker.of(CHAT, {"stream_options": {"include_usage": True,
                                                    "continuous_usage_stats": True}})  # fmt: skip
    first = running(" a", 8, 1) + running(" bc", 8, 3)
    assert t.feed(first) == [running(" a", 8, 1), running(" bc", 8, 3)]  # relayed as they came
    t.next_segment()
    out = t.feed(running("", 10, 0, role="assistant") + running(" d", 10, 1)
                 + event({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
                                                   "total_tokens": 11}}))  # fmt: skip
    assert len(out) == 2  # the continuation's role chunk dropped
    whole = {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}
    assert [json.loads(e[6:])["usage"] for e in out] == [whole, whole]


def test_an_engine_error_then_done_is_a_break_not_an_end():
    """vLLM ends a stream that failed mid-way with its error event and ``[DONE]``: passed
    on, the client would take a cut answer for a whole one."""
    t = StreamTracker(chat=True)
    error = {"error": {"message": "engine died: SECRET", "type": "internal_server_error",
                       "code": 500}}  # fmt: skip
    assert t.feed(delta(" a") + event(error) + b"data: [DONE]\n\n") == [delta(" a")]
    assert t.upstream_error == "an error event: 500 (19 characters of message)" and not t.done
    # the message may quote the prompt or the answer: never kept, so never logged
    t.next_segment()  # continued elsewhere: that segment's [DONE] ends the stream
    assert t.feed(delta(" b") + b"data: [DONE]\n\n")[-1] == b"data: [DONE]\n\n"
    assert t.done and t.delivered == " a b"


def test_an_answer_that_said_why_it_stopped_is_not_continued():
    t = StreamTracker(chat=True)
    stop = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    t.feed(delta(" a") + stop)  # then the plane dies before [DONE]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    assert t.finished and continuation(CHAT, body, t) is None  # [DONE] goes out instead


def test_what_a_continuation_would_repeat_or_break_is_not_continued():
    """chat's vLLM ``echo`` would echo the continued message (the text twice); constrained
    decoding would restart its grammar mid-answer; a reasoning stream would reason again."""
    user = [{"role": "user", "content": "hi"}]
    assert not_continuable(CHAT, {"messages": user, "echo": True}) == "echo is set"
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    assert not_continuable(CHAT, {"messages": user, "response_format": schema})
    assert not_continuable("/v1/completions", {"prompt": "x", "guided_regex": "[a-z]+"})
    assert not_continuable(CHAT, {"messages": user, "response_format": None}) == ""
    assert not_continuable(CHAT, {"messages": user, "response_format": {"type": "text"}}) == ""
    t = StreamTracker(chat=True)
    t.feed(delta(reasoning_content="let me think"))
    assert t.why_not == "it was streaming reasoning"


def test_a_response_format_type_of_any_json_shape_is_judged_not_raised():
    """A list as the type raised TypeError (unhashable) in admission: a plain-text 500."""
    user = [{"role": "user", "content": "hi"}]
    for kind in (["x"], {"a": 1}, 3, None):
        why = not_continuable(CHAT, {"messages": user, "response_format": {"type": kind}})
        assert why == ("" if kind is None else "response_format is set")


def test_the_continued_limits_are_the_ones_the_engine_reads():
    """The limit left is what the engine would still generate: chat's
    max_completion_tokens wins over max_tokens; a completion's null max_tokens is 16;
    100.0 and "100" are 100; min_tokens shrinks with what was delivered (left as asked, the
    engine refused min_tokens above the reduced max_tokens with a 400)."""

    def after_two(path: str, payload: dict[str, object]) -> dict[str, object] | None:
        t = StreamTracker(chat=path == CHAT)
        if path == CHAT:
            t.feed(delta(" a") + delta(" b"))
        else:
            t.feed(event({"choices": [{"index": 0, "text": " a"}]}) * 2)
        return continuation(path, payload, t)

    user = [{"role": "user", "content": "hi"}]
    body = after_two(CHAT, {"messages": user, "max_tokens": 10, "max_completion_tokens": 100})
    assert body is not None and body["max_completion_tokens"] == 98
    body = after_two("/v1/completions", {"prompt": "x", "max_tokens": None})
    assert body is not None and body["max_tokens"] == 14
    for limit in (100.0, "100"):
        body = after_two(CHAT, {"messages": user, "max_tokens": limit})
        assert body is not None and body["max_tokens"] == 98
    body = after_two(CHAT, {"messages": user, "max_tokens": 100, "min_tokens": 50})
    assert body is not None and (body["max_tokens"], body["min_tokens"]) == (98, 48)


def test_an_event_sent_a_byte_at_a_time_is_whole_and_costs_linear_time():
    """Each chunk copied the whole buffer: a plane sending an event of ~1 MiB a byte at a
    time cost the gateway ~10^11 bytes of copying (minutes of CPU on its one loop)."""
    import time

    big = delta("x" * 800_000)
    t = StreamTracker(chat=True)
    began = time.process_time()
    out = [e for i in range(len(big)) for e in t.feed(big[i : i + 1])]
    assert time.process_time() - began < 8
    assert out == [big] and t.delivered == "x" * 800_000 and not t.untracked


def test_a_stream_without_end_is_relayed_on_but_its_text_is_not_held(monkeypatch):
    import workloadplane.gateway.continuation as continuation

    monkeypatch.setattr(continuation, "MAX_TRACKED_CHARS", 1000)
    t = StreamTracker(chat=True)
    out = [e for _ in range(30) for e in t.feed(delta("y" * 50))]
    assert len(out) == 30  # every event still goes to the client
    assert t.text == [] and t.why_not == "it delivered over 1000 characters"
