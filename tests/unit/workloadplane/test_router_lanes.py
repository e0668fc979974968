"""Rollout lanes in the router (issue 18): a lane — a desired entry that ``serves`` another
deployment — takes its ``traffic_share`` of that deployment's requests, sticky per session
key, only while it has a ready replica; it is never asked for by name nor listed as a model;
every answer is counted per lane (requests, errors, latency buckets) for the gates."""

from __future__ import annotations

import collections

from controlplane.contracts import (
    LATENCY_BUCKETS_S,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.router.core import Router


def entry(name: str, revision: str, serves: str = "", share: float = 0.0) -> DeploymentDesired:
    return DeploymentDesired(name=name, spec=RevisionSpec(model_id="m", revision=revision),
                             quota=ReplicaQuota(min=1, max=1), serves=serves,
                             traffic_share=share)  # fmt: skip


def replica(rid: str, deployment: str, state: str = "ready") -> ReplicaStatus:
    return ReplicaStatus(replica_id=rid, deployment=deployment, revision="r", state=state,  # type: ignore[arg-type]
                         endpoint=f"http://127.0.0.1:{9 + len(rid)}")  # fmt: skip


def router_with(share: float, lane_state: str = "ready") -> Router:
    router = Router()
    router.set_deployments([entry("chat", "r1"), entry("chat--r2", "r2", "chat", share)])
    router.set_replicas([replica("s1", "chat"), replica("c1", "chat--r2", lane_state)])
    return router


def test_a_lane_takes_its_share_of_the_deployments_requests_and_sticks_per_session():
    router = router_with(0.25)
    chat = router.resolve("chat")
    assert chat is not None and chat.name == "chat"
    picks = collections.Counter(router.lane_for(chat, f"user-{i}").name for i in range(4000))
    assert 0.22 < picks["chat--r2"] / 4000 < 0.28, picks
    # one session, one revision, every time; and a wider share keeps the sessions it had
    on_lane = [f"user-{i}" for i in range(200) if router.lane_for(chat, f"user-{i}").name != "chat"]
    assert on_lane and all(router.lane_for(chat, k).name == "chat--r2" for k in on_lane)
    wider = router_with(0.5)
    wide_chat = wider.resolve("chat")
    assert wide_chat is not None
    assert all(wider.lane_for(wide_chat, k).name == "chat--r2" for k in on_lane)
    # without a session key the draw is random, at the same share
    unkeyed = collections.Counter(router.lane_for(chat, None).name for _ in range(4000))
    assert 0.21 < unkeyed["chat--r2"] / 4000 < 0.29, unkeyed


def test_a_session_key_with_a_lone_surrogate_draws_one_lane_every_time():
    router = router_with(0.5)
    chat = router.resolve("chat")
    assert chat is not None  # the key is request text ("user", a prompt): it may hold one
    assert len({router.lane_for(chat, "\ud800 session").name for _ in range(20)}) == 1


def test_a_lane_without_a_ready_replica_or_share_takes_nothing_and_is_not_a_model():
    for router in (router_with(0.5, "starting"), router_with(0.0)):
        chat = router.resolve("chat")
        assert chat is not None
        assert {router.lane_for(chat, f"k{i}").name for i in range(100)} == {"chat"}
    router = router_with(0.5)
    assert router.resolve("chat--r2") is None  # a lane is not asked for by name
    router.backends["c1"].health.failed(0.0, "probe")  # ejected: out of rotation
    chat = router.resolve("chat")
    assert chat is not None and {router.lane_for(chat, f"k{i}").name for i in range(50)} == {"chat"}
    assert [m for m, _ in router.model_ids()] == ["chat"]


def test_answers_are_counted_per_lane_with_errors_and_latency_buckets():
    router = router_with(0.5)
    assert router.outcomes("chat--r2") is None
    router.count_outcome("chat--r2", False, 0.08, 0.9)
    router.count_outcome("chat--r2", True, None, 0.01)
    router.count_outcome("chat", False, 0.3, 70.0)
    lane, stable = router.outcomes("chat--r2"), router.outcomes("chat")
    assert lane is not None and stable is not None
    assert (lane.requests, lane.errors, stable.requests, stable.errors) == (2, 1, 1, 0)
    assert lane.since == router.since and len(lane.ttft_buckets) == len(LATENCY_BUCKETS_S) + 1
    assert lane.ttft_buckets[LATENCY_BUCKETS_S.index(0.1)] == 1 and sum(lane.ttft_buckets) == 1
    assert lane.e2e_buckets[LATENCY_BUCKETS_S.index(1.0)] == 1
    assert lane.e2e_buckets[LATENCY_BUCKETS_S.index(0.025)] == 1
    assert stable.e2e_buckets[LATENCY_BUCKETS_S.index(120.0)] == 1
    assert router.load_report()["outcomes"]["chat--r2"]["errors"] == 1


def test_the_gateways_see_a_canary_lane_as_part_of_its_deployment_and_never_a_shadow():
    from workloadplane.router.load import RecentWindow, plane_load

    router = Router()
    router.set_deployments([entry("chat", "r1"), entry("chat--r2", "r2", "chat", 0.25),
                            entry("chat--r3", "r3", "chat", 0.5).model_copy(
                                update={"mirror": True})])  # fmt: skip
    router.set_replicas([replica("s1", "chat"), replica("s22", "chat"),
                         replica("c1", "chat--r2"), replica("c333", "chat--r3")])  # fmt: skip
    report = plane_load(router, RecentWindow(), "a", sequence=1, interval_s=1.0, now=10.0)
    (chat,) = report.deployments  # the lanes are no deployments of their own
    limit = router.deployments["chat"].limit
    assert chat.name == "chat" and chat.ready_replicas == 3 and chat.capacity == 3 * limit


def test_a_promoted_lanes_replicas_join_their_deployment_and_a_rolled_back_ones_do_not():
    from controlplane.contracts import DesiredState
    from workloadplane.reconcile import lane_adoptions

    def lane_replica(rid: str, revision: str, state: str = "ready") -> ReplicaStatus:
        return ReplicaStatus(replica_id=rid, deployment="chat--r2", revision=revision,
                             state=state, serves="chat")  # type: ignore[arg-type]  # fmt: skip

    replicas = [lane_replica("c1", "r2"), lane_replica("c2", "r2", "draining"),
                ReplicaStatus(replica_id="s1", deployment="chat", revision="r1", state="ready")]  # fmt: skip
    promoted = DesiredState(cluster="a", generation=2, deployments=[entry("chat", "r2")],
                            retired=["chat--r2"])  # fmt: skip
    assert lane_adoptions(promoted, replicas) == [("c1", "chat")]  # not the draining one
    rolled_back = promoted.model_copy(update={"deployments": [entry("chat", "r1")]})
    assert lane_adoptions(rolled_back, replicas) == []
    running = promoted.model_copy(
        update={"deployments": [entry("chat", "r1"), entry("chat--r2", "r2", "chat", 0.5)]}
    )
    assert lane_adoptions(running, replicas) == []  # the lane is still desired


async def test_shadow_copies_are_bounded_and_the_excess_is_dropped_and_counted():
    from workloadplane.router.app import RouterApp
    from workloadplane.router.core import RouterConfig
    from workloadplane.router.dispatch import Dispatcher, Forward
    from workloadplane.router.metrics import RouterMetrics

    router = Router(RouterConfig(shadow_max_in_flight=1))
    shadow = entry("chat--r3", "r3", "chat", 1.0).model_copy(update={"mirror": True})
    router.set_deployments([entry("chat", "r1"), shadow])
    router.set_replicas([replica("s1", "chat"), replica("c333", "chat--r3")])
    metrics = RouterMetrics()
    app = RouterApp(router, Dispatcher(router, metrics), metrics)
    chat = router.resolve("chat")
    assert chat is not None
    (lane,) = router.shadows_for(chat)
    copy = Forward("/v1/chat/completions", [], b"{}", False)
    for _ in range(3):  # share 1.0: every request is copied, but only one copy at a time
        app._mirror(lane, copy)
    dropped = metrics.registry.get_sample_value(
        "gpufleet_router_shadow_requests_total", {"deployment": "chat--r3", "outcome": "dropped"}
    )
    assert len(app._shadows) == 1 and dropped == 2
    counted = router.outcomes("chat--r3")  # what the heartbeat reports for the shadow lane
    assert counted is not None and counted.dropped == 2 and counted.requests == 0
    await app.close_shadows()


async def test_metrics_of_a_lane_that_left_are_dropped_and_start_from_zero_if_it_comes_back():
    """Every rollout lane used to add label sets to /metrics for good: once a lane is no
    longer desired and its last replica is gone, its series leave the scrape."""
    from workloadplane.router.app import RouterApp
    from workloadplane.router.dispatch import Dispatcher
    from workloadplane.router.metrics import RouterMetrics

    router = router_with(0.5)
    metrics = RouterMetrics()
    app = RouterApp(router, Dispatcher(router, metrics), metrics)
    for name in ("chat", "chat--r2"):
        metrics.answered(name, "200")
        metrics.of(name).ttft.observe(0.1)
        metrics.ejected(name, "x")

    async def scrape() -> str:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await app.scrape(send)
        return b"".join(m.get("body", b"") for m in sent).decode()

    assert 'deployment="chat--r2"' in await scrape()
    router.set_deployments([entry("chat", "r1")])  # rolled back, and ...
    router.set_replicas([replica("s1", "chat")])  # ... its last replica gone
    text = await scrape()
    assert 'deployment="chat--r2"' not in text
    assert 'gpufleet_router_requests_total{code="200",deployment="chat"} 1.0' in text
    metrics.answered("chat--r2", "200")  # a lane of that name again: counted from zero
    value = metrics.registry.get_sample_value(
        "gpufleet_router_requests_total", {"deployment": "chat--r2", "code": "200"}
    )
    assert value == 1.0
