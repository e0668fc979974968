"""One spelling and one default per knob, from the API spec to the agent's desired state."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane import contracts
from controlplane.db import models as m
from controlplane.db.columns import cluster_status, deployment_autoscaling, set_status
from controlplane.services.desired import _deployment_desired
from controlplane.specs import AutoscalingSpec, DeploymentSpec, PlacementSpec

SHARED = ("window_seconds", "scale_down_delay_seconds", "target_concurrency")


def make_deployment(**autoscaling: object) -> m.Deployment:
    spec = DeploymentSpec(
        name="chat",
        model_id="m",
        gpus_per_replica=1,
        gpu_types=["H100-80G"],
        autoscaling=AutoscalingSpec.model_validate(autoscaling),
    )
    row = m.Deployment(revision=1, priority=spec.priority)
    for key, value in spec.model_dump(mode="json").items():
        setattr(row, key, value)
    return row


def make_placement(replicas: int, min_replicas: int = 0) -> tuple[m.Placement, str]:
    return m.Placement(replicas=replicas, min_replicas=min_replicas, max_replicas=replicas), "p"


def test_the_api_spells_and_defaults_the_autoscaling_knobs_as_the_contract_does():
    api, wire = AutoscalingSpec.model_fields, contracts.AutoscalingPolicy.model_fields
    for name in SHARED:
        assert api[name].default == wire[name].default, name


def test_a_knob_left_unset_reaches_the_agent_with_the_documented_default():
    desired = _deployment_desired(make_deployment(), [make_placement(2)], global_replicas=2)
    assert desired.autoscaling.target_concurrency == 8.0
    assert desired.autoscaling.window_seconds == 60.0
    assert desired.autoscaling.scale_to_zero_idle_seconds is None  # min 1: never to zero

    to_zero = make_deployment(min_replicas=0)
    idle = _deployment_desired(to_zero, [make_placement(1)], 1).autoscaling
    assert idle.scale_to_zero_idle_seconds == 300.0


def test_a_schedule_windows_min_is_split_by_this_clusters_share():
    row = make_deployment(schedule=[{"start": "08:00", "end": "18:00", "min_replicas": 5}])
    desired = _deployment_desired(row, [make_placement(1)], global_replicas=4)
    (window,) = desired.autoscaling.schedule
    assert (window.start, window.end, window.min_replicas) == ("08:00", "18:00", 2)  # ceil 1.25


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("window_s", "window_seconds", 30.0),
        ("scale_down_delay_s", "scale_down_delay_seconds", 120.0),
        ("concurrency_target", "target_concurrency", 16.0),
        ("scale_to_zero_idle_s", "scale_to_zero_idle_seconds", 900.0),
    ],
)
def test_an_old_autoscaling_spelling_is_read_as_the_new_one(old, new, value):
    spec = AutoscalingSpec.model_validate({old: value})
    assert spec.model_dump()[new] == value
    assert old not in spec.model_dump()


def test_old_placement_spellings_are_read_as_the_engines_words():
    spec = PlacementSpec.model_validate({"min_providers": 2, "min_regions": 3})
    assert (spec.min_distinct_providers, spec.min_distinct_regions) == (2, 3)


def test_both_spellings_of_one_knob_are_refused_with_the_fix():
    with pytest.raises(ValidationError, match="send only `target_concurrency`"):
        AutoscalingSpec.model_validate({"target_concurrency": 4, "concurrency_target": 16})


def test_a_row_stored_with_old_keys_still_parses_at_the_database_edge():
    row = m.Deployment(autoscaling={"concurrency_target": 16, "min_replicas": 2})
    assert deployment_autoscaling(row).target_concurrency == 16.0
    assert deployment_autoscaling(row).min_replicas == 2


def test_set_status_keeps_other_keys_writes_only_on_change_and_refuses_unknown_ones():
    row = m.Cluster(status={"cordoned": True, "written_by_a_newer_version": 1})
    assert set_status(row, demand={"chat": 2}) is True
    assert row.status == {"cordoned": True, "written_by_a_newer_version": 1, "demand": {"chat": 2}}
    assert set_status(row, demand={"chat": 2}) is False
    assert cluster_status(row).demand == {"chat": 2}
    assert set_status(row, cordoned=None) is True  # None removes a key
    assert cluster_status(row).cordoned is False
    with pytest.raises(KeyError, match="ClusterStatus has no spot_available_gpus"):
        set_status(row, spot_available_gpus=3)
    with pytest.raises(ValidationError):
        set_status(row, demand={"chat": "many"})
