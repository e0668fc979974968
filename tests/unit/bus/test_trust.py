"""What a plane may claim (controlplane/trust.py), pure: a report of an entry it was told
to retire is dropped without a rejection; one of an entry it was never given is rejected."""

from __future__ import annotations

from controlplane.contracts import DeploymentObserved, ObservedState, ReplicaStatus
from controlplane.trust import Given, check_observed

GIVEN = Given(deployments={"chat": 4}, pools=frozenset({"p1"}), retired=frozenset({"chat--r2"}))


def _report(entry: str) -> ObservedState:
    return ObservedState(
        cluster="a",
        source="cluster/a",
        deployments=[
            DeploymentObserved(name="chat", demand=2),
            DeploymentObserved(name=entry, demand=3),
        ],
        replicas=[
            ReplicaStatus(replica_id="a-1", deployment="chat", revision="1", state="ready"),
            ReplicaStatus(replica_id="a-2", deployment=entry, revision="2", state="draining"),
        ],
    )


def test_a_retired_entry_still_draining_does_not_count_and_is_no_rejection():
    """A rollout's lane after its promotion or rollback (or a deleted deployment) drains on
    the plane, which reports it meanwhile: what it was asked to do, not a forgery."""
    checked = check_observed(_report("chat--r2"), GIVEN)
    assert checked.rejections == []
    assert [d.name for d in checked.state.deployments] == ["chat"]
    assert [r.replica_id for r in checked.state.replicas] == ["a-1"]


def test_an_entry_never_given_is_rejected_and_does_not_count():
    checked = check_observed(_report("triage"), GIVEN)
    assert sorted(r.reason for r in checked.rejections) == ["deployment_not_given"] * 2
    assert [d.name for d in checked.state.deployments] == ["chat"]
    assert [r.replica_id for r in checked.state.replicas] == ["a-1"]


def test_a_report_of_only_what_was_given_counts_whole():
    report = _report("chat")
    checked = check_observed(report, GIVEN)
    assert checked.rejections == [] and checked.state == report


def test_replicas_beyond_what_the_deployment_may_have_are_not_recorded():
    """chat may have 4 replicas fleet-wide; a plane claiming 50 (each a row, and GPU-hours
    in the ledger) gets the first 8 (the demand cap, 2 × 4) recorded, and one rejection."""
    report = ObservedState(
        cluster="a",
        source="cluster/a",
        replicas=[
            ReplicaStatus(replica_id=f"a-{i}", deployment="chat", revision="1", state="ready")
            for i in range(50)
        ],
    )
    checked = check_observed(report, GIVEN)
    assert [r.replica_id for r in checked.state.replicas] == [f"a-{i}" for i in range(8)]
    assert [r.reason for r in checked.rejections] == ["replica_bound"]
    assert "more than 8 replicas" in checked.rejections[0].detail
