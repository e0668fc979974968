"""The provider's mapping between Terraform values and API specs (pure, no services): one
vocabulary with controlplane/specs.py, and the normalisation that keeps plans exact."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from controlplane import specs
from tests.integration.terraform.conftest import provider_module

fields = provider_module("fields")
kinds = provider_module("kinds")

SPECS: dict[str, type[BaseModel]] = {
    "Provider": specs.ProviderSpec,
    "Region": specs.RegionSpec,
    "GpuType": specs.GpuTypeSpec,
    "Pool": specs.PoolSpec,
    "Cluster": specs.ClusterSpec,
    "Deployment": specs.DeploymentSpec,
    "Token": specs.TokenSpec,
}
NESTED = {
    "autoscaling": specs.AutoscalingSpec,
    "placement": specs.PlacementSpec,
    "schedule": specs.ScheduleEntry,
    "failover": specs.FailoverSpec,
    "rollout": specs.RolloutSpec,
    "gates": specs.GatesSpec,
    "shadow": specs.ShadowSpec,
}


def _spec_default(model: type[BaseModel], name: str) -> Any:
    info = model.model_fields[name]
    if info.default_factory is not None:
        value = info.default_factory()  # pyright: ignore[reportCallIssue]
        return value.model_dump() if isinstance(value, BaseModel) else value
    return None if info.default is PydanticUndefined else info.default


def _check_fields(model: type[BaseModel], tf_fields: tuple[Any, ...]) -> None:
    assert {f.key for f in tf_fields} == set(model.model_fields), model.__name__
    for f in tf_fields:
        info = model.model_fields[f.key]
        assert f.required == info.is_required(), f"{model.__name__}.{f.key}"
        if f.type == "block":
            _check_fields(NESTED[f.name], f.children)
        elif not f.required:
            assert fields.same(f, f.default, _spec_default(model, f.key)), f.key


@pytest.mark.parametrize("kind", kinds.KINDS, ids=lambda k: k.resource)
def test_every_resource_has_the_api_fields_and_defaults(kind: Any) -> None:
    _check_fields(SPECS[kind.kind], kind.fields)


POOL = {k.kind: k for k in kinds.KINDS}["Pool"].fields
DEPLOYMENT = {k.kind: k for k in kinds.KINDS}["Deployment"].fields
PROVIDER = {k.kind: k for k in kinds.KINDS}["Provider"].fields


def test_what_the_api_normalises_reads_back_as_written() -> None:
    written = {
        "name": "p",
        "provider_name": "aws-main",
        "price_per_gpu_hour": "2.10",
        "term_start": "2026-01-01T00:00:00+00:00",
        "gpus": 16,
    }
    api = {
        "name": "p",
        "provider": "aws-main",
        "price_per_gpu_hour": "2.100000",
        "term_start": "2026-01-01T00:00:00Z",
        "gpus": 16.0,
        "gpus_per_instance": 8,
    }
    state = fields.read_fields(POOL, api, written)
    assert {k: v for k, v in state.items() if v is not None} == written
    sets = fields.read_fields(
        PROVIDER, {"certifications": ["HIPAA", "SOC2"]}, {"certifications": ["SOC2", "HIPAA"]}
    )
    assert sets["certifications"] == ["SOC2", "HIPAA"]


def test_a_default_reads_as_unset_until_it_is_changed_out_of_band() -> None:
    assert fields.read_fields(POOL, {"gpus_per_instance": 8}, {})["gpus_per_instance"] is None
    assert fields.read_fields(POOL, {"gpus_per_instance": 4}, {})["gpus_per_instance"] == 4
    changed = fields.read_fields(
        POOL, {"price_per_gpu_hour": "3.000000"}, {"price_per_gpu_hour": "2.10"}
    )
    assert changed["price_per_gpu_hour"] == "3.000000"


def _block(name: str) -> Any:
    return next(f for f in DEPLOYMENT if f.name == name)


def _autoscaling(**knobs: Any) -> dict[str, Any]:
    element: dict[str, Any] = {c.name: None for c in _block("autoscaling").children} | {
        "schedule": []
    }
    return element | knobs


def test_nested_blocks_keep_what_was_written_and_show_drift_knob_by_knob() -> None:
    api = {
        "autoscaling": {
            "min_replicas": 1,
            "max_replicas": 4,
            "window_seconds": 60.0,
            "scale_down_delay_seconds": 300.0,
            "target_concurrency": 8.0,
            "scale_to_zero_idle_seconds": 300.0,
            "schedule": [
                {
                    "days": [0, 1, 2, 3, 4],
                    "start": "08:00",
                    "end": "18:00",
                    "timezone": "UTC",
                    "min_replicas": 2,
                }
            ],
        },
        "placement": specs.PlacementSpec().model_dump(),
    }
    window = {"days": None, "start": "08:00", "end": "18:00", "timezone": None, "min_replicas": 2}
    prior = {"autoscaling": [_autoscaling(max_replicas=4, schedule=[window])], "placement": []}
    state = fields.read_fields(DEPLOYMENT, api, prior)
    assert state["autoscaling"] == prior["autoscaling"]
    assert state["placement"] == [], "a block left out stays out while the API holds defaults"

    api["autoscaling"]["window_seconds"] = 120.0
    drifted = fields.read_fields(DEPLOYMENT, api, prior)["autoscaling"][0]
    assert drifted["window_seconds"] == 120.0 and drifted["min_replicas"] is None
    assert fields.changed(DEPLOYMENT, prior, {**prior, "autoscaling": [drifted]})


def test_terraform_values_become_the_api_body() -> None:
    values = {"name": "p", "provider_name": "aws-main", "gpus": 16.0, "quota_gpus": None}
    assert fields.to_spec(POOL, values) == {"name": "p", "provider": "aws-main", "gpus": 16}
    body = fields.to_spec(
        DEPLOYMENT, {"autoscaling": [_autoscaling(max_replicas=4)], "placement": []}
    )
    assert body == {"autoscaling": {"max_replicas": 4}}


def test_a_shadow_block_is_the_deployments_shadow_and_none_is_no_shadow() -> None:
    base = {"name": "d", "model_id": "m", "gpus_per_replica": 1, "gpu_types": ["L4"]}
    shadow = [{"share": 0.1, "replicas": 2.0, "engine_image": "vllm:next", "model_id": None}]
    body = fields.to_spec(DEPLOYMENT, {**base, "shadow": shadow})
    assert body["shadow"] == {"share": 0.1, "replicas": 2, "engine_image": "vllm:next"}
    assert specs.DeploymentSpec.model_validate(body).shadow is not None
    assert "shadow" not in fields.to_spec(DEPLOYMENT, {**base, "shadow": []})  # PUT: removed
    (field,) = [f for f in DEPLOYMENT if f.name == "shadow"]
    assert fields.read_value(field, None, None) == []  # the API shows none: no block
    read = fields.read_value(field, body["shadow"], None)
    assert read[0]["share"] == 0.1 and read[0]["engine_args"] is None


def test_a_url_the_api_normalises_is_the_one_written() -> None:
    """The API writes `http://10.0.0.5:8000` back as `http://10.0.0.5:8000/`: compared as
    written, every apply of a cluster with an endpoint ended in "inconsistent result"."""
    endpoint = fields.Field("endpoint", "url")
    for written, stored in (
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000/"),
        ("HTTP://Router.Example:80", "http://router.example/"),
        ("https://r.example:443/base", "https://r.example/base"),
    ):
        assert fields.same(endpoint, written, stored)
        assert fields.read_value(endpoint, stored, written) == written  # the state keeps it
    assert not fields.same(endpoint, "http://10.0.0.5:8000", "http://10.0.0.5:8001/")
    cluster = next(k for k in kinds.KINDS if k.kind == "Cluster")
    assert next(f for f in cluster.fields if f.name == "endpoint").type == "url"


def test_surrounding_blanks_the_api_strips_and_an_empty_list_are_read_right() -> None:
    labels = fields.Field("labels", "map_string")
    assert fields.same(labels, {"team": "x "}, {"team": "x"})  # "inconsistent result" before
    assert fields.same(fields.Field("description", "string"), " hi ", "hi")
    deployment = next(k for k in kinds.KINDS if k.kind == "Deployment")
    shadow = next(f for f in deployment.fields if f.name == "shadow")
    unset = {c.name: None for c in shadow.children} | {"share": 0.1}
    empty = {**unset, "engine_args": []}
    assert not fields.same(shadow, unset, empty)  # [] is "no arguments", unset "the deployment's"
