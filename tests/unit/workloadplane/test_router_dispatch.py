"""The dispatcher's retry policy on loopback replicas: a 503 or a refused connection before
any byte ejects that replica and retries on another; on the last attempt the replica's
status, or the last error, is the answer; the slot is freed in every case."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.router.app import RouterApp
from workloadplane.router.core import (
    Clock,
    DeploymentGoneError,
    QueueTimeoutError,
    Router,
    RouterConfig,
    Ticket,
)
from workloadplane.router.dispatch import Dispatcher, Forward
from workloadplane.router.httpserver import HttpServer
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.upstream import UpstreamError
from workloadplane.runtime.process import free_port


def replica_app(status: int):
    async def app(scope, receive, send) -> None:
        await receive()
        body = b"from %d" % status
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


@contextlib.asynccontextmanager
async def replicas(*statuses: int | None) -> AsyncIterator[list[str]]:
    """One loopback replica per status (None: a port nobody listens on); their URLs."""
    servers, urls = [], []
    for status in statuses:
        port = free_port()
        if status is not None:
            server = HttpServer(replica_app(status))
            await server.start("127.0.0.1", port)
            servers.append(server)
        urls.append(f"http://127.0.0.1:{port}")
    try:
        yield urls
    finally:
        for server in servers:
            await server.close(grace_s=1)


def plane(
    urls: list[str], clock: Clock = time.monotonic, **config
) -> tuple[Router, Dispatcher, RouterMetrics]:
    router = Router(RouterConfig(**{"queue_max_wait_s": 0.5, **config}), clock)
    router.set_deployments(
        [
            DeploymentDesired(
                name="chat",
                spec=RevisionSpec(model_id="chat", revision="r1"),
                quota=ReplicaQuota(min=0, max=len(urls)),
                autoscaling=AutoscalingPolicy(target_concurrency=4),
            )
        ]
    )
    router.set_replicas(
        [
            ReplicaStatus(
                replica_id=f"r{i}", deployment="chat", revision="r1", state="ready", endpoint=url
            )
            for i, url in enumerate(urls)
        ]
    )
    metrics = RouterMetrics()
    return router, Dispatcher(router, metrics), metrics


REQUEST = Forward("/v1/completions", [], b'{"model": "chat"}', stream=False)


def never_gone() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def retries(metrics: RouterMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "gpufleet_router_retries_total", {"deployment": "chat", "reason": reason}
    )
    return value or 0.0


async def test_a_503_ejects_that_replica_and_the_request_goes_to_another():
    async with replicas(503, 200) as urls:
        router, dispatcher, metrics = plane(urls)
        ticket = Ticket(tier=1, tried={"r1"})  # r0 first: the failing one
        exchange = await dispatcher.dispatch(
            router.deployments["chat"], ticket, REQUEST, never_gone
        )
        assert exchange.response.status == 200
        assert await exchange.response.read() == b"from 200"
        exchange.close()
        assert router.backends["r0"].health.ejected
        assert not router.backends["r1"].health.ejected
        assert retries(metrics, "status_503") == 1
        assert router.load("chat") == (0, 0), "every slot is freed"
        router.close()


async def test_a_refused_connection_is_retried_elsewhere():
    async with replicas(None, 200) as urls:
        router, dispatcher, metrics = plane(urls)
        ticket = Ticket(tier=1, tried={"r1"})
        exchange = await dispatcher.dispatch(
            router.deployments["chat"], ticket, REQUEST, never_gone
        )
        assert exchange.response.status == 200
        exchange.close()
        assert router.backends["r0"].health.ejected
        assert retries(metrics, "before_first_byte") == 1
        router.close()


async def test_when_every_attempt_fails_the_last_status_is_the_answer():
    """502/503/504 on the last attempt is relayed as it is (the client sees the replica's
    answer); with max_attempts=2 and two failing replicas, one retry happens."""
    async with replicas(503, 502) as urls:
        router, dispatcher, metrics = plane(urls, max_attempts=2)
        ticket = Ticket(tier=1, tried={"r1"})
        exchange = await dispatcher.dispatch(
            router.deployments["chat"], ticket, REQUEST, never_gone
        )
        assert exchange.response.status == 502
        exchange.close()
        assert retries(metrics, "status_503") == 1
        assert router.load("chat") == (0, 0)
        router.close()


async def test_refused_everywhere_raises_the_last_upstream_error():
    async with replicas(None) as urls:
        router, dispatcher, _ = plane(urls, max_attempts=1)
        with pytest.raises(UpstreamError, match="connect"):
            await dispatcher.dispatch(
                router.deployments["chat"], Ticket(tier=1), REQUEST, never_gone
            )
        assert router.load("chat") == (0, 0)
        router.close()


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Real sockets: wait (briefly polling) for ``check``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def holding_replica(seen: list[str]):
    """A replica that works on a request until the router hangs up (never answers): records
    ``request``, then what its ``receive`` says (``http.disconnect``)."""

    async def app(scope, receive, send) -> None:
        await receive()
        seen.append("request")
        seen.append((await receive())["type"])

    return app


def answered(metrics: RouterMetrics, code: str) -> float:
    value = metrics.registry.get_sample_value(
        "gpufleet_router_requests_total", {"deployment": "chat", "code": code}
    )
    return value or 0.0


@pytest.mark.parametrize("queued", [False, True], ids=["sent-at-once", "sent-after-queueing"])
async def test_a_client_that_hangs_up_while_a_replica_works_frees_its_slot_and_is_a_499(
    queued: bool,
):
    """A non-streaming answer's head comes only when generation ends: a client that left
    meanwhile kept its slot (load, in flight), and was counted a 200 with its tokens."""
    seen: list[str] = []
    replica, front = HttpServer(holding_replica(seen)), None
    port = free_port()
    await replica.start("127.0.0.1", port)
    router, dispatcher, metrics = plane([f"http://127.0.0.1:{port}"], concurrency_override=1,
                                        queue_max_wait_s=30)  # fmt: skip
    try:
        front, front_port = HttpServer(RouterApp(router, dispatcher, metrics)), free_port()
        await front.start("127.0.0.1", front_port)
        entry, blocker = router.deployments["chat"], Ticket(tier=1)
        if queued:  # the one slot is taken: the request waits in the queue first
            assert router.try_acquire(entry, blocker) is not None
        _, writer = await asyncio.open_connection("127.0.0.1", front_port)
        body = b'{"model": "chat", "prompt": "hi"}'
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
        if queued:
            await until(lambda: len(entry.queue) == 1, "the request to queue")
            router.release(router.backends["r0"], blocker)
        await until(lambda: seen == ["request"], "the replica to get the request")
        assert router.load("chat") == (1, 0)
        writer.close()  # the client hangs up
        await until(lambda: seen == ["request", "http.disconnect"], "the exchange aborted")
        await until(lambda: router.load("chat") == (0, 0), "the slot freed")
        await until(lambda: answered(metrics, "499") == 1, "a 499 counted")
        assert answered(metrics, "200") == 0 and router.usage("chat") is None
        assert not router.backends["r0"].health.ejected  # the replica did nothing wrong
        assert retries(metrics, "before_first_byte") == 0
    finally:
        if front is not None:
            await front.close(grace_s=1)
        await replica.close(grace_s=1)
        router.close()


@pytest.mark.parametrize("queued", [False, True], ids=["waiting-for-a-head", "in-the-queue"])
async def test_a_cancelled_dispatch_leaves_no_slot_taken(queued: bool):
    """A dispatch cancelled while it waited for a replica's head kept that replica's slot for
    good; one cancelled in the queue left a waiter that took the next free slot for nobody
    (the replica looked busy, drains waited, the autoscaler saw load)."""
    seen: list[str] = []
    replica = HttpServer(holding_replica(seen))
    port = free_port()
    await replica.start("127.0.0.1", port)
    router, dispatcher, _ = plane([f"http://127.0.0.1:{port}"], concurrency_override=1,
                                  queue_max_wait_s=30)  # fmt: skip
    try:
        entry, blocker = router.deployments["chat"], Ticket(tier=1)
        if queued:
            assert router.try_acquire(entry, blocker) is not None
        task = asyncio.create_task(dispatcher.dispatch(entry, Ticket(tier=1), REQUEST, never_gone))
        if queued:
            await until(lambda: len(entry.queue) == 1, "the request to queue")
        else:
            await until(lambda: seen == ["request"], "the replica to get the request")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if queued:
            assert not entry.queue
            router.release(router.backends["r0"], blocker)
        await until(lambda: router.load("chat") == (0, 0), "no slot taken")
        assert router.try_acquire(entry, Ticket(tier=1)) is not None, "the slot is free"
    finally:
        await replica.close(grace_s=1)
        router.close()


async def test_an_answer_that_breaks_before_its_body_is_an_openai_shaped_502():
    """A replica that sends a non-streamed answer's head and then closes: the client got a
    plain-text 500 without its request id, and the request was not counted."""

    async def head_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n")  # fmt: skip
        await writer.drain()
        writer.close()

    replica = await asyncio.start_server(head_then_close, "127.0.0.1", 0)
    port = replica.sockets[0].getsockname()[1]
    router, dispatcher, metrics = plane([f"http://127.0.0.1:{port}"])
    front, front_port = HttpServer(RouterApp(router, dispatcher, metrics)), free_port()
    await front.start("127.0.0.1", front_port)
    try:
        body = b'{"model": "chat", "prompt": "hi"}'
        reader, writer = await asyncio.open_connection("127.0.0.1", front_port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nx-request-id: rq-7\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                     % (len(body), body))  # fmt: skip
        async with asyncio.timeout(5):
            answer = await reader.read(65536)
            while b"upstream_failed" not in answer and not reader.at_eof():
                answer += await reader.read(65536)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 502"), answer[:200]
        assert b"x-request-id: rq-7" in answer.lower()
        assert b'"type": "upstream_error"' in answer or b'"upstream_failed"' in answer
        assert answered(metrics, "502") == 1
    finally:
        await front.close(grace_s=1)
        replica.close()
        router.close()


async def test_a_shadow_copy_that_hangs_is_ended_at_its_deadline_and_counted_an_error():
    """Copies to a shadow lane had no deadline: a hung one held its permit for good (later
    copies were all dropped) and was never counted, so the comparison never saw the hang."""
    seen: list[str] = []
    replica = HttpServer(holding_replica(seen))
    port = free_port()
    await replica.start("127.0.0.1", port)
    router = Router(RouterConfig(shadow_timeout_s=0.3))
    lane = DeploymentDesired(name="chat--r3", spec=RevisionSpec(model_id="chat", revision="r3"),
                             quota=ReplicaQuota(min=0, max=1), serves="chat", traffic_share=1.0,
                             mirror=True)  # fmt: skip
    main = DeploymentDesired(name="chat", spec=RevisionSpec(model_id="chat", revision="r1"),
                             quota=ReplicaQuota(min=0, max=1))  # fmt: skip
    router.set_deployments([main, lane])
    router.set_replicas([ReplicaStatus(replica_id="s0", deployment="chat--r3", revision="r3",
                                       state="ready", endpoint=f"http://127.0.0.1:{port}")])  # fmt: skip
    metrics = RouterMetrics()
    app = RouterApp(router, Dispatcher(router, metrics), metrics)
    try:
        chat = router.resolve("chat")
        assert chat is not None
        (shadow,) = router.shadows_for(chat)
        app._mirror(shadow, REQUEST)
        await until(lambda: seen == ["request"], "the copy to reach the replica")
        await until(lambda: not app._shadows, "the copy to end at its deadline")
        errors = metrics.registry.get_sample_value(
            "gpufleet_router_shadow_requests_total", {"deployment": "chat--r3", "outcome": "error"}
        )
        assert errors == 1
        counted = router.outcomes("chat--r3")
        assert counted is not None and counted.errors == 1
        assert router.load("chat--r3") == (0, 0), "its slot is free"
    finally:
        await app.close_shadows()
        await replica.close(grace_s=1)
        router.close()


async def test_a_stream_head_past_its_deadline_is_retried_elsewhere_without_ejecting():
    """vLLM sends a stream's head after the prompt's preprocessing: a 2 s deadline that
    ejected the replica took healthy ones out one by one on long prompts. Past the deadline
    the request moves on; whether the replica is dead is the probes' to say."""

    async def slow_head(scope, receive, send) -> None:
        await receive()
        await asyncio.sleep(1.0)  # the prompt's preprocessing
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    servers, urls = [], []
    for _ in range(2):
        server, port = HttpServer(slow_head), free_port()
        await server.start("127.0.0.1", port)
        servers.append(server)
        urls.append(f"http://127.0.0.1:{port}")
    router, dispatcher, metrics = plane(urls, first_byte_timeout_s=0.2)
    stream = Forward("/v1/completions", [], b'{"model": "chat", "stream": true}', stream=True)
    try:
        with pytest.raises(UpstreamError, match=r"no response within 0\.2s"):
            await dispatcher.dispatch(
                router.deployments["chat"], Ticket(tier=1), stream, never_gone
            )
        assert retries(metrics, "head_timeout") == router.config.max_attempts
        assert retries(metrics, "before_first_byte") == 0
        assert not any(b.health.ejected for b in router.backends.values())
        assert router.load("chat") == (0, 0)
    finally:
        for server in servers:
            await server.close(grace_s=1)
        router.close()


def stalling_stream_replica(seen: list[str]):
    """A replica that answers a stream's head and first event, then sends nothing more
    (a generation stalled; its /health still answers), until the router hangs up."""

    async def app(scope, receive, send) -> None:
        await receive()
        seen.append("request")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b'data: {"x": 1}\n\n',
                    "more_body": True})  # fmt: skip
        seen.append((await receive())["type"])

    return app


async def ask_for_a_stream(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that asks the router at ``port`` for a streamed completion."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model": "chat", "prompt": "hi", "stream": true}'
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
    return reader, writer


async def test_a_client_that_leaves_a_stalled_stream_frees_its_slot():
    """After a stream's head the client's departure was looked at only when a chunk came: a
    replica that stalled (its /health fine) kept the request in flight for good, its slot
    and the autoscaler's load with it."""
    seen: list[str] = []
    replica, front = HttpServer(stalling_stream_replica(seen)), None
    port = free_port()
    await replica.start("127.0.0.1", port)
    router, dispatcher, metrics = plane([f"http://127.0.0.1:{port}"], queue_max_wait_s=30)
    try:
        front, front_port = HttpServer(RouterApp(router, dispatcher, metrics)), free_port()
        await front.start("127.0.0.1", front_port)
        reader, writer = await ask_for_a_stream(front_port)
        await asyncio.wait_for(reader.readuntil(b"data: "), 5)  # the first event came
        assert router.load("chat") == (1, 0)
        writer.close()  # the client leaves; the replica sends nothing more
        await until(lambda: router.load("chat") == (0, 0), "the slot freed")
        await until(lambda: seen == ["request", "http.disconnect"], "the replica told")
        assert not router.backends["r0"].health.ejected
    finally:
        if front is not None:
            await front.close(grace_s=1)
        await replica.close(grace_s=1)
        router.close()


async def test_a_stream_whose_replica_stalls_ends_with_an_error_event_at_its_idle_deadline():
    """A replica whose generation stalls (its /health fine) held the stream, its slot and
    its client for good while the client stayed."""
    seen: list[str] = []
    replica, front = HttpServer(stalling_stream_replica(seen)), None
    port = free_port()
    await replica.start("127.0.0.1", port)
    router, dispatcher, metrics = plane([f"http://127.0.0.1:{port}"], stream_idle_s=0.3)
    try:
        front, front_port = HttpServer(RouterApp(router, dispatcher, metrics)), free_port()
        await front.start("127.0.0.1", front_port)
        reader, writer = await ask_for_a_stream(front_port)
        async with asyncio.timeout(5):
            answer = b""
            while b"stream_broken" not in answer:
                answer += await reader.read(65536)
        assert b"sent nothing for 0.3s" in answer and b"[DONE]" not in answer
        writer.close()
        await until(lambda: router.load("chat") == (0, 0), "the slot freed")
        await until(lambda: seen == ["request", "http.disconnect"], "the replica told")
    finally:
        if front is not None:
            await front.close(grace_s=1)
        await replica.close(grace_s=1)
        router.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


async def test_retries_wait_in_the_queue_until_one_deadline_not_one_each():
    """The queue deadline restarted at each retry: a request could wait max_attempts x
    queue_max_wait_s. Here it waited its whole minute for a slot, then its replica failed
    (503, ejected): its retry may not wait another minute."""
    clock = FakeClock()
    async with replicas(503) as urls:
        router, dispatcher, metrics = plane(urls, clock, concurrency_override=1,
                                            queue_max_wait_s=60)  # fmt: skip
        entry, blocker = router.deployments["chat"], Ticket(tier=1)
        assert router.try_acquire(entry, blocker) is not None
        task = asyncio.create_task(dispatcher.dispatch(entry, Ticket(tier=1), REQUEST, never_gone))
        await until(lambda: len(entry.queue) == 1, "the request to queue")
        clock.now += 61  # a minute later the slot frees: past the request's deadline
        router.release(router.backends["r0"], blocker)
        with pytest.raises(QueueTimeoutError):
            await asyncio.wait_for(task, 5)  # at once, not after another 60 s
        assert retries(metrics, "status_503") == 1 and router.load("chat") == (0, 0)
        router.close()


async def test_a_request_waiting_for_a_lane_that_loses_its_replicas_goes_to_its_deployment():
    async with replicas(200, 200) as urls:
        router, dispatcher, _ = plane(urls[:1], concurrency_override=1, queue_max_wait_s=30)
        chat = DeploymentDesired(name="chat", spec=RevisionSpec(model_id="chat", revision="r1"),
                                 quota=ReplicaQuota(min=0, max=1))  # fmt: skip
        canary = chat.model_copy(update={"name": "chat--r2", "serves": "chat",
                                         "traffic_share": 0.5})  # fmt: skip
        router.set_deployments([chat, canary])
        on_lane = ReplicaStatus(replica_id="c1", deployment="chat--r2", revision="r2",
                                state="ready", endpoint=urls[1])  # fmt: skip
        stable = ReplicaStatus(replica_id="r0", deployment="chat", revision="r1", state="ready",
                               endpoint=urls[0])  # fmt: skip
        router.set_replicas([stable, on_lane])
        entry, blocker = router.deployments["chat--r2"], Ticket(tier=1)
        assert router.try_acquire(entry, blocker) is not None  # the lane's one slot
        task = asyncio.create_task(dispatcher.dispatch(entry, Ticket(tier=1), REQUEST, never_gone))
        await until(lambda: len(entry.queue) == 1, "the request to queue for the lane")
        router.set_replicas([stable])  # the lane's replica failed: nothing left to wait for
        exchange = await asyncio.wait_for(task, 5)
        assert exchange.deployment == "chat" and exchange.replica_id == "r0"
        assert await exchange.response.read() == b"from 200"
        exchange.close()
        router.set_deployments([chat])  # rolled back: a request left waiting for chat...
        entry = router.deployments["chat"]
        assert router.try_acquire(entry, blocker) is not None
        task = asyncio.create_task(dispatcher.dispatch(entry, Ticket(tier=1), REQUEST, never_gone))
        await until(lambda: len(entry.queue) == 1, "the request to queue")
        router.set_deployments([])  # ...and chat deleted: it fails at once, not in 30 s
        with pytest.raises(DeploymentGoneError):
            await asyncio.wait_for(task, 5)
        router.close()
