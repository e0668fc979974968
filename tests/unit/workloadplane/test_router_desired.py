"""What the router keeps of a deployment that left the desired set (deleted, or a rolled
back lane) while its last replicas drain: no new request (404 as for an unknown model),
no request left waiting for it (503 at once, not a 504 after ``queue_max_wait_s``), no
scale-from-zero wake-up for it, and none of its counters once its last replica is gone."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from controlplane.contracts import DeploymentDesired, ReplicaQuota, ReplicaStatus, RevisionSpec
from workloadplane.router.app import RouterApp
from workloadplane.router.core import DeploymentGoneError, Router, RouterConfig, Ticket
from workloadplane.router.dispatch import Dispatcher
from workloadplane.router.load import RecentWindow
from workloadplane.router.metrics import RouterMetrics


def deployment(name: str, serves: str = "", share: float = 0.0) -> DeploymentDesired:
    return DeploymentDesired(name=name, spec=RevisionSpec(model_id="m", revision="r1"),
                             quota=ReplicaQuota(min=0, max=2), serves=serves,
                             traffic_share=share)  # fmt: skip


def replica(rid: str, name: str, state: str = "ready") -> ReplicaStatus:
    return ReplicaStatus(replica_id=rid, deployment=name, revision="r1", state=state,  # type: ignore[arg-type]
                         endpoint="http://127.0.0.1:9")  # fmt: skip


class Asgi:
    """One request to the app in process: the body, then a client that stays."""

    def __init__(self, body: bytes) -> None:
        self.body, self.sent, self._stay = body, [], asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._stay.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, dict]:
        status = next(m["status"] for m in self.sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return status, json.loads(body)


async def ask(app: RouterApp, model: str) -> Asgi:
    client = Asgi(json.dumps({"model": model}).encode())
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    await app(scope, client.receive, client.send)
    return client


async def test_a_deleted_deployment_takes_no_new_request_while_its_replica_drains():
    router = Router()
    metrics = RouterMetrics()
    app = RouterApp(router, Dispatcher(router, metrics), metrics)
    router.set_deployments([deployment("chat"), deployment("code")])
    router.set_replicas([replica("c1", "chat")])
    router.set_deployments([deployment("code")])  # chat deleted; c1 still draining
    router.set_replicas([replica("c1", "chat", "draining")])
    assert "chat" in router.deployments and router.resolve("chat") is None
    assert [m for m, _ in router.model_ids()] == ["code"]
    status, body = (await ask(app, "chat")).answer()
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert await router.scale_from_zero.take(0) == set()
    with pytest.raises(DeploymentGoneError):  # a retry of a request that resolved earlier
        await router.acquire(router.deployments["chat"], Ticket(tier=1))
    assert await router.scale_from_zero.take(0) == set(), "nobody manages it"


async def test_a_request_waiting_for_a_deployment_that_is_deleted_gets_503_at_once():
    router = Router(RouterConfig(queue_max_wait_s=120))
    metrics = RouterMetrics()
    app = RouterApp(router, Dispatcher(router, metrics), metrics)
    router.set_deployments([deployment("chat")])
    router.set_replicas([replica("c1", "chat", "starting")])  # a cold start: requests wait
    request = asyncio.create_task(ask(app, "chat"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert router.load("chat") == (0, 1)
    router.set_deployments([])
    client = await asyncio.wait_for(request, 1)  # not after 120 s
    status, body = client.answer()
    assert status == 503 and body["error"]["code"] == "deployment_removed"
    assert "chat" in body["error"]["message"]
    router.set_replicas([])
    assert "chat" not in router.deployments


def test_counters_of_a_name_that_left_are_dropped_and_start_again_under_a_new_since():
    """Each rollout lane added its name to the usage and outcome tables for good."""
    router = Router()
    router.set_deployments([deployment("chat"), deployment("chat--r2", "chat", 0.5)])
    router.set_replicas([replica("s1", "chat"), replica("c1", "chat--r2")])
    router.count_usage("chat--r2", 10, 5, 100)
    router.count_outcome("chat--r2", False, 0.1, 0.5)
    router.count_usage("chat", 1, 1, 1)
    lane = router.usage("chat--r2")
    assert lane is not None and lane.since == router.since
    router.set_deployments([deployment("chat")])  # rolled back: c1 still finishes its work
    assert router.usage("chat--r2") is not None
    router.set_replicas([replica("s1", "chat")])  # c1 gone: the lane leaves
    assert router.usage("chat--r2") is None and router.outcomes("chat--r2") is None
    assert set(router.load_report()["usage"]) == {"chat"}
    stable = router.usage("chat")
    assert stable is not None and stable.since == router.since and stable.input_tokens == 1
    router.set_deployments([deployment("chat"), deployment("chat--r2", "chat", 0.5)])
    router.count_usage("chat--r2", 20, 5, 100)  # the name again: counted from 0, anew
    again = router.usage("chat--r2")
    assert again is not None and again.input_tokens == 20 and again.since != lane.since


def test_the_recent_window_forgets_a_deployment_whose_completions_left_it():
    window = RecentWindow(window_s=10.0)
    window.finished("chat--r2", 0.0, 0.1)
    window.finished("chat", 5.0, 0.2)
    window.finished("chat", 12.0, 0.2)  # a window on: chat--r2's last one left it
    assert set(window._done) == {"chat"}
    assert window.summary("chat--r2", 12.0) == (None, 0.0)
    assert window.summary("chat", 12.0)[0] == pytest.approx(0.2)
