"""Bad input is a 4xx problem naming what to change, never a 500; the document says so.

Each case here was a 500, a `{"detail": …}` body or a silent coercion before (issue 13).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest
from sqlalchemy import text

from controlplane.db import models as m
from controlplane.jurisdictions import ISO_3166_ALPHA2
from tests.integration.api import builders as b

PROBLEM = "application/problem+json"


def _problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["status"] == status and body["detail"], body
    return body


@pytest.mark.parametrize(
    ("url", "parameter"),
    [
        ("replicas?cluster=%00", "query.cluster"),
        ("pools/%00", "path.ref"),
        ("events?object_name=a%00b", "query.object_name"),
        ("audit?actor=%00", "query.actor"),
        ("deployments/a%00b/revisions", "path.ref"),
        ("providers?provider_kind=x%01", "query.provider_kind"),
        ("instances/%7F", "path.ref"),
        ("gpu-types?limit=1%00", "query.limit"),
    ],
)
def test_a_control_character_in_a_parameter_is_a_422_naming_it(admin, url, parameter):
    response = admin.client.get(f"/api/v1/{url}", headers=admin.headers)  # the URL as written
    body = _problem(response, 422)
    assert body["errors"][0]["field"] == parameter
    assert "control character" in body["detail"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("providers", b.provider("p-nul", labels={"team": "a\u0000b"}), "labels"),
        ("tokens", {"name": "t-nul", "role": "viewer", "description": "x\u0000"}, "description"),
        ("deployments", b.deployment(engine_args=["--x\u0001"]), "engine_args"),
        ("gpu-types", b.gpu_type("G-BOOL", memory_gib=True), "memory_gib"),
        ("pools", b.pool("p-bool", gpus=False), "gpus"),
        ("regions", b.region("aws-bool", latitude=True), "latitude"),
    ],
)
def test_a_control_character_or_a_bool_for_a_number_in_a_body_is_a_422(admin, path, body, field):
    b.seed(admin)
    problem = _problem(admin.post(path, body), 422)
    assert [e["field"] for e in problem["errors"]] == [field]


def test_unknown_routes_wrong_methods_and_over_deep_json_are_problems(admin):
    assert "/api/v1/docs" in _problem(admin.get("nowhere"), 404)["detail"]
    wrong = admin.client.post("/healthz")
    assert "GET" in _problem(wrong, 405)["detail"] and wrong.headers["allow"] == "GET"
    deep = admin.client.post(
        "/api/v1/providers",
        content="[" * 100_000 + "]" * 100_000,
        headers=admin.headers | {"content-type": "application/json"},
    )
    assert _problem(deep, 400)["type"].endswith("/bad-request")


def test_if_match_star_replaces_an_existing_object_and_never_creates_one(admin):
    assert admin.post("gpu-types", b.gpu_type()).status_code == 201
    updated = admin.put("gpu-types/H100-80G", b.gpu_type(memory_gib=94), **{"If-Match": "*"})
    assert updated.status_code == 200 and updated.json()["memory_gib"] == 94
    patched = admin.patch("gpu-types/H100-80G", {"memory_gib": 80}, **{"If-Match": "*"})
    assert patched.status_code == 200 and patched.json()["generation"] == 3
    missing = admin.put("gpu-types/B200", b.gpu_type("B200"), **{"If-Match": "*"})
    assert "drop If-Match" in _problem(missing, 409)["detail"]
    assert admin.get("gpu-types/B200").status_code == 404


def test_if_match_star_never_brings_back_an_object_deleted_while_it_waited(admin, engine):
    """The existence check ran before the row lock: a PUT with If-Match: * that waited on a
    DELETE's lock then found no row and created it (201), undoing the delete."""
    assert admin.post("gpu-types", b.gpu_type()).status_code == 201
    with engine.connect() as deleting:
        deleting.execute(text("DELETE FROM gpu_types WHERE name = 'H100-80G'"))  # holds the lock
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            put = pool.submit(
                admin.put, "gpu-types/H100-80G", b.gpu_type(memory_gib=94), **{"If-Match": "*"}
            )
            with engine.connect() as watch:  # until the PUT waits on the row lock
                query = text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%gpu_types%'"
                )
                deadline = time.monotonic() + 20
                while not watch.execute(query).scalar() and time.monotonic() < deadline:
                    watch.rollback()
                    time.sleep(0.02)
            deleting.commit()
            answer = put.result(timeout=30)
    assert "drop If-Match" in _problem(answer, 409)["detail"]
    assert admin.get("gpu-types/H100-80G").status_code == 404


def test_an_if_match_that_is_no_generation_is_a_400_naming_the_header(admin):
    assert admin.post("gpu-types", b.gpu_type()).status_code == 201
    for value in (b"\xb2", "1" * 5000, '"abc"'):  # "²" (latin-1) passes isdigit, not int()
        refused = admin.put("gpu-types/H100-80G", b.gpu_type(), **{"If-Match": value})
        assert "If-Match must be the object's generation" in _problem(refused, 400)["detail"]


def test_a_limit_of_zero_is_a_422_on_every_list(admin):
    for path in ("events", "audit", "pools", "replicas"):
        assert _problem(admin.get(path, limit=0), 422)["errors"][0]["field"] == "query.limit"


def _replica_and_instance(admin: Any, session_factory: Any) -> tuple[str, str]:
    b.seed(admin)
    deployment = admin.post("deployments", b.deployment()).json()
    with session_factory() as s, s.begin():
        cluster = s.query(m.Cluster).filter_by(name="use1-a").one()
        pool = s.query(m.Pool).one()
        instance = m.Instance(
            pool_id=pool.id, cluster_id=cluster.id, idempotency_key="k", gpus=8, state="running"
        )
        instance.provider_instance_id = "i-0abc"
        s.add(instance)
        s.flush()
        s.add(
            m.Replica(
                name="chat-llm-1-13478-1",
                deployment_id=deployment["id"],
                cluster_id=cluster.id,
                instance_id=instance.id,
                state="ready",
            )
        )
        return instance.id, cluster.id


def test_replicas_and_instances_are_found_by_the_names_the_tables_show(admin, session_factory):
    instance_id, _ = _replica_and_instance(admin, session_factory)
    replica = admin.get("replicas/chat-llm-1-13478-1")
    assert replica.status_code == 200, replica.text
    assert admin.get(f"replicas/{replica.json()['id']}").json() == replica.json()
    for ref in (instance_id, instance_id[:8], "i-0abc"):
        found = admin.get(f"instances/{ref}")
        assert found.status_code == 200 and found.json()["id"] == instance_id, ref
    assert "id prefix" in _problem(admin.get("instances/i-nothere"), 404)["detail"]
    assert _problem(admin.get("instances/_%25"), 404)  # LIKE wildcards are not wildcards


def test_a_replica_name_shared_by_two_clusters_asks_for_the_id(admin, session_factory):
    _replica_and_instance(admin, session_factory)
    assert admin.post("clusters", b.cluster("use1-b")).status_code == 201
    with session_factory() as s, s.begin():
        first = s.query(m.Replica).one()
        other = s.query(m.Cluster).filter_by(name="use1-b").one()
        s.add(m.Replica(name=first.name, deployment_id=first.deployment_id, cluster_id=other.id))
    assert "use the id" in _problem(admin.get("replicas/chat-llm-1-13478-1"), 409)["detail"]


def test_the_document_declares_problems_the_bearer_scheme_and_what_validation_accepts(app_client):
    doc = app_client.get("/api/v1/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            errors = [code for code in responses if code[0] in "45"]
            assert "500" in errors and "422" in errors, f"{method} {path}"
            for code in errors:
                if (path, code) == ("/readyz", "503"):
                    continue
                assert list(responses[code]["content"]) == [PROBLEM], f"{method} {path} {code}"
            if path.startswith("/api/v1/"):
                assert operation["security"] == [{"bearer": []}], f"{method} {path}"
                assert {"401", "403"} <= set(responses), f"{method} {path}"
    assert {"200", "201"} <= set(doc["paths"]["/api/v1/pools/{ref}"]["put"]["responses"])
    schemas = doc["components"]["schemas"]
    assert set(schemas["Problem"]["required"]) == {"type", "title", "status", "detail"}
    assert "HTTPValidationError" not in schemas
    jurisdiction = schemas["RegionSpec"]["properties"]["jurisdiction"]
    assert set(jurisdiction["enum"]) == ISO_3166_ALPHA2 and "AA" not in jurisdiction["enum"]
    allowed = schemas["PlacementSpec"]["properties"]["allowed_jurisdictions"]["items"]
    assert set(allowed["enum"]) == ISO_3166_ALPHA2


def test_a_name_of_an_ids_form_is_refused_and_other_hex_names_are_names(admin):
    """Such a name was accepted, then every GET, PATCH or DELETE of it looked it up as an id:
    404 for an object that exists (or, named after another object's id, that other one)."""
    refused = admin.post("gpu-types", b.gpu_type("0123abcd-0000-4000-8000-0123456789ab"))
    assert "form of an object id" in _problem(refused, 422)["errors"][0]["message"]
    hexname = "0123456789abcdef-0123456789abcdef"  # uuid.UUID reads it; not an id's form
    assert admin.post("providers", b.provider()).status_code == 201
    assert admin.post("regions", b.region(hexname)).status_code == 201
    assert admin.get(f"regions/{hexname}").json()["name"] == hexname
    assert admin.patch(f"regions/{hexname}", {"latitude": 1}).status_code == 200
    assert admin.delete(f"regions/{hexname}").status_code == 204


def test_a_negative_zero_price_is_stored_as_zero_and_a_repeat_changes_nothing(admin):
    b.seed(admin)
    first = admin.put("pools/aws-use1-h100-od", b.pool(price_per_gpu_hour="-0"))
    assert first.json()["price_per_gpu_hour"] == "0.000000"
    again = admin.put("pools/aws-use1-h100-od", b.pool(price_per_gpu_hour="-0"))
    assert again.json()["generation"] == first.json()["generation"]


def test_a_key_twice_in_a_body_is_refused_naming_it(admin):
    """json.loads kept the last of two equal keys: one value was dropped without a word."""
    raw = b'{"name": "H100-80G", "memory_gib": 80, "memory_gib": 0}'
    twice = admin.client.post(
        "/api/v1/gpu-types",
        content=raw,
        headers=admin.headers | {"content-type": "application/json"},
    )
    assert "'memory_gib' twice" in _problem(twice, 400)["detail"]
    merged = admin.post("providers", b.provider(labels={"team": "a", "team ": "b"}))
    assert "'team' twice" in _problem(merged, 422)["detail"]
    assert admin.get("gpu-types/H100-80G").status_code == 404


def test_a_thousand_errors_get_an_answer_naming_twenty(admin):
    """Each error was named: a 1.5 MB body got a 20 MB answer."""
    body = b.gpu_type() | {f"unknown-{i}": 0 for i in range(1000)}
    problem = _problem(admin.post("gpu-types", body), 422)
    assert len(problem["errors"]) == 20
    assert problem["detail"].endswith("and 980 more (fix these first)")


def test_a_region_a_deployment_names_cannot_be_deleted(admin):
    """It could: the deployment then placed nowhere and no PATCH of it validated again."""
    b.seed(admin)
    assert admin.post("regions", b.region("aws-us-west-2")).status_code == 201
    allowed = b.deployment(placement={"allowed_regions": ["aws-us-west-2"]})
    assert admin.post("deployments", allowed).status_code == 201
    traffic = b.deployment("batch", traffic={"aws-us-west-2": 1})
    assert admin.post("deployments", traffic).status_code == 201
    for user in ("batch", "chat-llm"):
        refused = _problem(admin.delete("regions/aws-us-west-2"), 409)
        assert "named by deployments" in refused["detail"] and user in refused["detail"]
        assert admin.delete(f"deployments/{user}").status_code == 204
    assert admin.delete("regions/aws-us-west-2").status_code == 204


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("deployments", b.deployment(traffic={"a": 1e308, "b": 1e308}), "traffic.a"),
        (
            "deployments",
            b.deployment(autoscaling={"min_replicas": 0, "scale_to_zero_idle_seconds": 1e308}),
            "autoscaling.scale_to_zero_idle_seconds",
        ),
        (
            "placement/preview",
            {"changes": [{"kind": "cluster", "name": "use1-a", "state": "down"}] * 257},
            "changes",
        ),
        (
            "placement/preview",
            {"changes": [{"kind": "pool", "name": "p" * 100_000, "removed": True}]},
            "changes[0].pool.name",
        ),
    ],
    ids=["traffic-weight", "idle-seconds", "preview-changes", "preview-name"],
)
def test_numbers_and_lists_without_a_use_that_large_are_refused(admin, path, body, field):
    b.seed(admin)
    problem = _problem(admin.post(path, body), 422)
    assert problem["errors"][0]["field"] == field
