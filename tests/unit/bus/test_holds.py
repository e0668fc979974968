"""Which cluster keeps serving from a draining instance while a replacement starts elsewhere
(`hold_leaving` in the desired state): the deployment's deficit of ready replicas, given out
in cluster-name order, never more than a cluster has leaving."""

from __future__ import annotations

from controlplane.services.desired import split_holds


def test_the_deficit_is_given_out_in_cluster_order():
    assert split_holds(1, {"b": 1, "a": 1}) == {"a": 1, "b": 0}
    assert split_holds(3, {"b": 2, "a": 2}) == {"a": 2, "b": 1}


def test_no_deficit_holds_nothing_and_a_cluster_never_holds_more_than_it_has_leaving():
    assert split_holds(0, {"a": 2}) == {"a": 0}
    assert split_holds(-1, {"a": 2}) == {"a": 0}  # more ready than placed
    assert split_holds(5, {"a": 2}) == {"a": 2}
