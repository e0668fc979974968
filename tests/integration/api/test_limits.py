"""Size limits at the API (issue 12 item 11, issue 13 "No size limits"): a body above
GPUFLEET_API_MAX_BODY_BYTES gets 413, a field above its limit 422 naming field and limit,
and an object a demanding user writes still fits."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from controlplane.db import models as m
from controlplane.specs import MAX_ENGINE_ARGS_BYTES, MAX_LABELS
from tests.integration.api import builders as b

MiB = 1024 * 1024


def _problem_413(response) -> dict:
    assert response.status_code == 413, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["limit_bytes"] == MiB
    assert (
        "1048576 bytes" in problem["detail"] and "GPUFLEET_API_MAX_BODY_BYTES" in problem["detail"]
    )
    return problem


def test_the_14_mb_deployment_of_the_report_gets_413_and_is_not_stored(admin):
    b.seed(admin)
    huge = b.deployment(engine_args=["--x=" + "y" * (14 * MiB)])
    _problem_413(admin.post("deployments", huge))
    assert admin.get("deployments/chat-llm").status_code == 404


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(admin):
    b.seed(admin)

    def chunks() -> Iterator[bytes]:
        yield b'{"name": "aws-main", "provider_kind": "aws", "labels": {"a": "'
        for _ in range(3 * 16):
            yield b"z" * (64 * 1024)
        yield b'"}}'

    response = admin.client.put(
        "/api/v1/providers/aws-main",
        headers=admin.headers | {"Content-Type": "application/json"},
        content=chunks(),
    )
    assert "content-length" not in response.request.headers
    _problem_413(response)
    assert admin.get("providers/aws-main").json()["labels"] == {}


@pytest.mark.parametrize(
    ("path", "body", "field", "hint"),
    [
        ("providers", b.provider("p2", labels={f"k{i}": "v" for i in range(MAX_LABELS + 1)}),
         "labels", "at most 64 items"),
        ("providers", b.provider("p2", labels={"team": "v" * 257}), "labels.team", "at most 256 characters"),
        ("providers", b.provider("p2", labels={"k" * 129: "v"}), f"labels.{'k' * 129}.[key]",
         "at most 128 characters"),
        ("deployments", b.deployment(engine_args=["--a=" + "x" * 4096]), "engine_args[0]", "at most 4096"),
        ("deployments", b.deployment(engine_args=["--a"] * 257), "engine_args", "at most 256 items"),
        ("deployments", b.deployment(engine_args=["--chat-template=" + "x" * 4000] * 9),
         "engine_args", f"above the limit of {MAX_ENGINE_ARGS_BYTES} bytes"),
        ("deployments", b.deployment(model_revision="r" * 129), "model_revision", "at most 128"),
        # prompts are never logged: not by the engine either
        ("deployments", b.deployment(engine_args=["--max-model-len=512", "--enable_log_requests"]),
         "engine_args", "makes the engine log prompts"),
        ("deployments", b.deployment(engine_image="i" * 256), "engine_image", "at most 255"),
        ("deployments", b.deployment(gpu_types=[f"G{i}" for i in range(33)]), "gpu_types", "at most 32"),
        ("deployments", b.deployment(traffic={f"r{i}": 1 for i in range(257)}), "traffic", "at most 256"),
        ("clusters", b.cluster("c2", pools=[f"p{i}" for i in range(257)]), "pools", "at most 256"),
        ("pools", b.pool("p-new", instance_type="t" * 64), "instance_type", "at most 63"),
        ("tokens", {"name": "t", "role": "viewer", "description": "d" * 256}, "description", "at most 255"),
        # a count past a 32-bit column was a database error, a 500
        ("pools", b.pool("p-new", gpus=2**31), "gpus", "1000000"),
        ("pools", b.pool("p-new", quota_gpus=10**19), "quota_gpus", "1000000"),
        ("deployments", b.deployment(autoscaling={"min_replicas": 10**12, "max_replicas": 4}),
         "autoscaling.min_replicas", "10000"),
        # the engine's arrays are 64-bit: 10**19 replicas raised OverflowError, a 500
        ("placement/preview", {"changes": [{"kind": "deployment", "name": "chat-llm",
                                            "replicas": 10**19}]}, "changes[0].deployment.replicas", "10000"),
        ("placement/preview", {"changes": [{"kind": "pool", "name": "aws-use1-h100-od",
                                            "gpus": 10**19}]}, "changes[0].pool.gpus", "1000000"),
        # a year PostgreSQL stores but cannot read back: the row was a 500 on every read
        ("pools", b.reserved_pool(term_end="9999-12-31T23:59:59-01:00"), "term_end", "1970 and 2999"),
        ("tokens", {"name": "t", "role": "viewer", "expires_at": "0001-01-01T00:00:00+01:00"},
         "expires_at", "1970 and 2999"),
        ("pools", b.pool("p-spot", purchase_type="spot", interruptions_per_hour=10000),
         "interruptions_per_hour", "9999.999999"),
        ("clusters", b.cluster("c2", endpoint="http://router.example/" + "<" * 200), "endpoint",
         "once URL-quoted"),
        ("deployments", b.deployment(autoscaling={"min_replicas": 1, "max_replicas": 4, "schedule": [
            {"start": "09:00", "end": "17:00", "timezone": "Mars/Olympus", "min_replicas": 2}]}),
         "autoscaling.schedule[0].timezone", "not an IANA time zone"),
        ("placement/preview", {"changes": [{"kind": "pools", "name": "x"}]}, "changes[0]",
         "needs a 'kind' of 'cluster', 'pool', 'deployment'"),
    ],
)  # fmt: skip
def test_a_field_above_its_limit_is_a_422_naming_field_and_limit(admin, path, body, field, hint):
    b.seed(admin)
    response = admin.post(path, body)
    assert response.status_code == 422, response.text
    fields = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert field in fields, fields
    assert hint in fields[field]


def test_a_demanding_but_reasonable_deployment_fits(admin):
    """100 engine args of 300 characters, 48 labels of 200: well within every limit."""
    b.seed(admin)
    labels = {f"team.example.com/k{i}": "v" * 200 for i in range(48)}
    assert admin.post("providers", b.provider("lots", labels=labels)).status_code == 201
    args = [f"--arg-{i}={'x' * 290}" for i in range(100)]
    created = admin.post("deployments", b.deployment(engine_args=args))
    assert created.status_code == 201, created.text
    assert created.json()["engine_args"] == args


def test_an_object_stored_before_the_limits_stays_readable_and_must_shrink_to_change(
    admin, session_factory
):
    b.seed(admin)
    with session_factory() as s, s.begin():
        s.execute(
            update(m.Provider)
            .where(m.Provider.name == "aws-main")
            .values(labels={f"k{i}": "v" for i in range(500)})
        )
    shown = admin.get("providers/aws-main")
    assert shown.status_code == 200
    assert len(shown.json()["labels"]) == 500
    assert len(admin.get("providers").json()["items"]) == 1

    refused = admin.patch("providers/aws-main", {"certifications": ["SOC2"]})
    assert refused.status_code == 422
    assert "labels" in {e["field"] for e in refused.json()["errors"]}
    assert admin.patch("providers/aws-main", {"labels": None}).status_code == 200


def test_a_time_without_an_offset_is_read_as_utc_not_a_500(admin):
    """A naive term_end next to an aware term_start raised TypeError (a 500) comparing them."""
    b.seed(admin)
    body = b.reserved_pool(term_start="2026-01-01T00:00:00Z", term_end="2027-01-01T00:00:00")
    response = admin.post("pools", body)
    assert response.status_code == 201, response.text
    assert admin.get(f"pools/{body['name']}").json()["term_end"].startswith("2027-01-01T00:00:00")


def test_infinity_which_python_reads_as_json_is_a_422_not_a_500(admin):
    """PostgreSQL's jsonb (and JSON itself) has no Infinity: stored, it was a 500."""
    b.seed(admin)
    raw = b.deployment(traffic={"r": 1.0})
    body = json.dumps(raw).replace('"r": 1.0', '"r": Infinity').encode()
    response = admin.client.post(
        "/api/v1/deployments",
        headers=admin.headers | {"Content-Type": "application/json"},
        content=body,
    )
    assert response.status_code == 422, response.text
    fields = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert "finite" in fields["traffic.r"]
