from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.contracts import ReplicaState, ReplicaStatus
from tests.unit.workloadplane.builders import make_deployment, make_desired, make_replica
from workloadplane.reconcile import (
    DrainReplica,
    StartReplica,
    StopReplica,
    reconcile,
    replica_transitions,
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
            by_id[rid] = make_replica(rid, action.deployment, action.spec.revision, "ready")
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
