from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    InstanceDesired,
    PoolQuota,
    ReplicaQuota,
    ReplicaState,
    ReplicaStatus,
)
from tests.unit.workloadplane.builders import make_deployment, make_desired, make_replica
from workloadplane.reconcile import (
    DrainReplica,
    StartReplica,
    StopReplica,
    leaving_replicas,
    reconcile,
    replica_transitions,
    split_target,
    target_replicas,
)


def test_starts_up_to_min_without_an_autoscaler_wish():
    d = make_deployment(min_=2, max_=4)
    actions = reconcile(make_desired(1, d), [])
    assert actions == [StartReplica("chat", d.spec)] * 2


def test_nothing_to_do_when_converged():
    desired = make_desired(1, make_deployment(min_=2))
    assert reconcile(desired, [make_replica("x1"), make_replica("x2", state="starting")]) == []


def test_wish_is_clamped_into_the_quota():
    d = make_deployment(min_=1, max_=3)
    assert target_replicas(d, None) == 1
    assert target_replicas(d, 10) == 3
    assert target_replicas(d, 0) == 1
    assert len(reconcile(make_desired(1, d), [], {"chat": 10})) == 3


def test_scale_down_stops_starting_replicas_before_draining_ready_ones():
    desired = make_desired(1, make_deployment(min_=1, max_=4))
    replicas = [make_replica("r1"), make_replica("r2"), make_replica("r3", state="starting")]
    assert reconcile(desired, replicas) == [
        StopReplica("r3", "above target"),
        DrainReplica("r2", "above target"),
    ]


def test_removed_deployment_is_drained_and_failed_replicas_replaced():
    desired = make_desired(1, make_deployment(min_=1))
    replicas = [
        make_replica("old1", deployment="gone"),
        make_replica("old2", deployment="gone", state="starting"),
        make_replica("c1", state="failed"),
    ]
    actions = reconcile(desired, replicas)
    assert StopReplica("c1", "failed") in actions
    assert DrainReplica("old1", "deployment removed") in actions
    assert StopReplica("old2", "deployment removed") in actions
    assert sum(isinstance(a, StartReplica) for a in actions) == 1


def test_revision_change_rolls_without_dropping_below_target():
    new = make_deployment(revision="r2", min_=2)
    old = [make_replica("a", revision="r1"), make_replica("b", revision="r1")]
    first = reconcile(make_desired(2, new), old)
    assert first == [StartReplica("chat", new.spec)] * 2  # old ones keep serving
    one_ready = [*old, make_replica("n1", revision="r2"),
                 make_replica("n2", revision="r2", state="starting")]  # fmt: skip
    assert reconcile(make_desired(2, new), one_ready) == [
        DrainReplica("b", "replaced by a new revision")
    ]


def test_transitions_report_ready_and_failed_once():
    previous: dict[str, ReplicaState] = {"a": "starting", "b": "ready", "c": "ready"}
    current = [make_replica("a"), make_replica("b"), make_replica("c", state="failed"),
               make_replica("d")]  # fmt: skip
    kinds = [(k, r.replica_id) for k, r in replica_transitions(previous, current)]
    assert kinds == [("started", "a"), ("failed", "c"), ("started", "d")]
    assert replica_transitions({r.replica_id: r.state for r in current}, current) == []


def apply(actions, replicas: list[ReplicaStatus], counter: list[int]) -> list[ReplicaStatus]:
    """Carry out actions the way a runtime would; the new replicas come up ready."""
    by_id = {r.replica_id: r for r in replicas}
    for action in actions:
        if isinstance(action, StartReplica):
            counter[0] += 1
            rid = f"n{counter[0]}"
            by_id[rid] = make_replica(
                rid, action.deployment, action.spec.revision, "ready"
            ).model_copy(update={"pool": action.pool, "instance": action.instance})
        else:
            by_id.pop(action.replica_id)
    return list(by_id.values())


replica_states = st.sampled_from(["starting", "ready", "draining", "failed"])


@settings(max_examples=150, deadline=None)
@given(
    existing=st.lists(st.tuples(st.sampled_from(["chat", "embed", "gone"]),
                                st.sampled_from(["r1", "r2"]), replica_states), max_size=8),
    mins=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    wishes=st.tuples(st.integers(0, 8), st.integers(0, 8)),
)  # fmt: skip
def test_reconcile_converges_and_then_does_nothing(existing, mins, wishes):
    desired = make_desired(
        1, make_deployment("chat", "r2", mins[0], mins[0] + 2),
        make_deployment("embed", "r1", mins[1], mins[1] + 1),
    )  # fmt: skip
    wanted = {"chat": wishes[0], "embed": wishes[1]}
    replicas = [make_replica(f"e{i}", d, rev, s) for i, (d, rev, s) in enumerate(existing)]
    counter = [0]
    for _ in range(4):
        actions = reconcile(desired, replicas, wanted)
        replicas = apply(actions, replicas, counter)
    assert reconcile(desired, replicas, wanted) == []
    for d in desired.deployments:
        serving = [r for r in replicas
                   if r.deployment == d.name and r.revision == d.spec.revision
                   and r.state in ("starting", "ready")]  # fmt: skip
        assert len(serving) == target_replicas(d, wanted[d.name])
    assert not any(r.deployment == "gone" and r.state != "draining" for r in replicas)
    assert not any(r.state == "failed" for r in replicas)


# -- pools and instances (a spot notice inside one cluster) ------------------------------------

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def pooled(min_: int, max_: int, *quotas: tuple[str, int, int]) -> DeploymentDesired:
    d = make_deployment(min_=min_, max_=max_)
    return d.model_copy(
        update={"pool_quotas": [PoolQuota(pool=p, min=lo, max=hi) for p, lo, hi in quotas]}
    )


def on(rid: str, pool: str, instance: str | None = None, state: str = "ready") -> ReplicaStatus:
    return make_replica(rid, state=state).model_copy(update={"pool": pool, "instance": instance})


def instance(
    iid: str, pool: str, gpus: int = 1, drain_in_s: float | None = None
) -> InstanceDesired:
    deadline = None if drain_in_s is None else NOW + timedelta(seconds=drain_in_s)
    return InstanceDesired(id=iid, pool=pool, gpus=gpus, draining=drain_in_s is not None,
                           drain_deadline=deadline)  # fmt: skip


def spot_notice_desired(drain_in_s: float) -> DesiredState:
    """After the re-plan: one replica left on spot, one moved to on-demand, i-1 taken back."""
    desired = make_desired(2, pooled(2, 2, ("spot", 1, 1), ("od", 1, 1)))
    return desired.model_copy(update={"instances": [
        instance("i-1", "spot", drain_in_s=drain_in_s), instance("i-2", "spot"),
        instance("i-od", "od")]})  # fmt: skip


def test_spot_notice_starts_the_replacement_first_and_drains_when_it_is_ready():
    desired = spot_notice_desired(drain_in_s=120)
    spec = desired.deployments[0].spec
    running = [on("a", "spot", "i-1"), on("b", "spot", "i-2")]
    assert reconcile(desired, running, now=NOW) == [StartReplica("chat", spec, "od", "i-od")]
    starting = [*running, on("c", "od", "i-od", state="starting")]
    assert reconcile(desired, starting, now=NOW) == [], "the replica on i-1 serves meanwhile"
    ready = [*running, on("c", "od", "i-od")]
    assert reconcile(desired, ready, now=NOW) == [DrainReplica("a", "instance i-1 is draining")]
    assert leaving_replicas(desired, ready) == {"a"}, "what the autoscaler must not count"


def test_a_near_deadline_drains_at_once_even_without_a_ready_replacement():
    desired = spot_notice_desired(drain_in_s=20)  # inside the 30 s drain lead
    running = [on("a", "spot", "i-1"), on("b", "spot", "i-2"),
               on("c", "od", "i-od", state="starting")]  # fmt: skip
    assert reconcile(desired, running, now=NOW) == [
        DrainReplica("a", "instance i-1 is draining, deadline near")
    ]
    assert reconcile(desired, running, now=NOW, drain_lead=timedelta(seconds=10)) == []
    assert reconcile(desired, running) == [], "no clock: no deadline is near"


def test_a_starting_replica_on_a_draining_instance_is_stopped():
    desired = spot_notice_desired(drain_in_s=120)
    replicas = [on("a", "spot", "i-1", state="starting"), on("b", "spot", "i-2"),
                on("c", "od", "i-od")]  # fmt: skip
    assert reconcile(desired, replicas, now=NOW) == [
        StopReplica("a", "instance i-1 is draining, not ready yet")
    ]


def test_a_pool_the_deployment_no_longer_uses_is_left_after_the_move():
    desired = make_desired(3, pooled(1, 1, ("od", 1, 1)))
    spec = desired.deployments[0].spec
    assert reconcile(desired, [on("a", "spot")]) == [StartReplica("chat", spec, "od", None)]
    assert reconcile(desired, [on("a", "spot"), on("b", "od")]) == [
        DrainReplica("a", "pool spot no longer used")
    ]


def test_replicas_stay_where_they_are_and_new_ones_go_to_the_preferred_pool():
    desired = make_desired(1, pooled(1, 4, ("reserved", 1, 2), ("spot", 0, 2)))
    spec = desired.deployments[0].spec
    here = [on("a", "spot"), on("b", "spot")]
    assert reconcile(desired, here, {"chat": 3}) == [StartReplica("chat", spec, "reserved")]
    # scaling down gives back the least preferred pool's newest replica, down to its min
    three = [*here, on("c", "reserved")]
    assert reconcile(desired, three, {"chat": 2}) == [DrainReplica("b", "above target")]
    assert reconcile(desired, three, {"chat": 1}) == [
        DrainReplica("b", "above target"), DrainReplica("a", "above target")
    ]  # fmt: skip


def test_new_replicas_go_to_instances_with_free_gpus_and_never_to_a_draining_one():
    d = pooled(3, 3, ("od", 3, 3))
    d = d.model_copy(update={"spec": d.spec.model_copy(update={"gpus_per_replica": 4})})
    desired = make_desired(1, d).model_copy(update={"instances": [
        instance("i-x", "od", gpus=8, drain_in_s=300), instance("i-1", "od", gpus=8),
        instance("i-2", "od", gpus=8)]})  # fmt: skip
    actions = reconcile(desired, [on("a", "od", "i-1")], now=NOW)
    assert [(a.pool, a.instance) for a in actions if isinstance(a, StartReplica)] == [
        ("od", "i-1"),
        ("od", "i-2"),
    ]
    full = [on("a", "od", "i-1"), on("b", "od", "i-1"), on("c", "od", "i-2"),
            on("d", "od", "i-2")]  # fmt: skip
    assert split_target([], [], 0) == []
    assert reconcile(desired, full[:3], {"chat": 3}, now=NOW) == []
    started = reconcile(desired.model_copy(update={"deployments": [
        d.model_copy(update={"quota": ReplicaQuota(min=5, max=5),
                             "pool_quotas": [PoolQuota(pool="od", min=5, max=5)]})]}),
        full, now=NOW)  # fmt: skip
    assert started == [StartReplica("chat", d.spec, "od", None)], "no room: no instance named"


def test_an_older_agents_replica_without_a_pool_counts_in_the_first_pool():
    desired = make_desired(1, pooled(1, 1, ("od", 1, 1)))
    assert reconcile(desired, [make_replica("old")]) == []


@settings(max_examples=150, deadline=None)
@given(
    existing=st.lists(st.tuples(st.sampled_from(["p1", "p2", "p3"]),
                                st.sampled_from(["i1", "i2", "i3", None]), replica_states),
                      max_size=8),
    quotas=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=3),
    wish=st.integers(0, 10),
    draining=st.sampled_from([None, "i1", "i2"]),
)  # fmt: skip
def test_pooled_reconcile_converges_within_every_pools_quota(existing, quotas, wish, draining):
    qs = [(f"p{i + 1}", lo, lo + extra) for i, (lo, extra) in enumerate(quotas)]
    d = pooled(sum(lo for _, lo, _ in qs), sum(hi for *_, hi in qs), *qs)
    desired = make_desired(1, d).model_copy(update={"instances": [
        instance(i, f"p{n}", gpus=2, drain_in_s=60 if i == draining else None)
        for n, i in ((1, "i1"), (2, "i2"), (3, "i3"))]})  # fmt: skip
    replicas = [on(f"e{i}", p, inst, s) for i, (p, inst, s) in enumerate(existing)]
    counter = [0]
    for _ in range(4):
        replicas = apply(reconcile(desired, replicas, {"chat": wish}, now=NOW), replicas, counter)
    assert reconcile(desired, replicas, {"chat": wish}, now=NOW) == []
    target = target_replicas(d, wish)
    pools = {p for p, *_ in qs}
    serving = [r for r in replicas if r.state in ("starting", "ready")]
    placed = [
        r for r in serving if r.pool in pools and (draining is None or r.instance != draining)
    ]
    assert len(placed) == target
    for pool, lo, hi in qs:
        assert lo <= sum(r.pool == pool for r in placed) <= max(hi, target)
    # make before break: a replica left behind serves only until a replacement is ready
    left = [r for r in serving if r not in placed]
    assert all(r.state == "ready" for r in left)
    assert len(left) <= target - sum(r.state == "ready" for r in placed)


def test_a_held_replica_serves_until_the_control_plane_lets_it_go_or_the_deadline_nears():
    """The replacement starts on another cluster: this plane cannot see it get ready, so the
    control plane holds the leaving replica (``hold_leaving``) and lowers the hold later."""
    moved = make_desired(2, pooled(1, 1, ("spot", 1, 1))).model_copy(update={"instances": [
        instance("i-1", "spot", drain_in_s=120), instance("i-2", "spot")]})  # fmt: skip
    held = moved.model_copy(update={"deployments": [
        moved.deployments[0].model_copy(update={"hold_leaving": 1})]})  # fmt: skip
    running = [on("a", "spot", "i-1"), on("b", "spot", "i-2")]
    assert reconcile(held, running, now=NOW) == []
    assert reconcile(moved, running, now=NOW) == [DrainReplica("a", "instance i-1 is draining")]
    soon = NOW + timedelta(seconds=100)  # 20 s before the deadline: inside the 30 s lead
    assert reconcile(held, running, now=soon) == [
        DrainReplica("a", "instance i-1 is draining, deadline near")
    ]
    # the deployment left this cluster altogether: quota 0, the held replica still serves
    gone = held.model_copy(update={"deployments": [held.deployments[0].model_copy(update={
        "quota": ReplicaQuota(min=0, max=0), "pool_quotas": []})]})  # fmt: skip
    assert reconcile(gone, [on("a", "spot", "i-1")], now=NOW) == []
