"""The OpenAPI document says what each route returns, and what the routes return matches it.

A client generated from `/api/v1/openapi.json` (the Terraform provider, a dashboard) must be
able to trust it: every route names a response model, and real responses from a fleet with
one of everything validate against the model their route declares.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from tests.integration.api import builders as b


def _check(doc: dict[str, Any], method: str, template: str, response: Any) -> None:
    """Validate a response against the schema the document declares for its status code."""
    declared = doc["paths"][template][method.lower()]["responses"]
    assert str(response.status_code) in declared, f"{method} {template}: {response.text}"
    schema = declared[str(response.status_code)]["content"]["application/json"]["schema"]
    # the document is the root, so `#/components/schemas/…` references resolve
    Draft202012Validator({**schema, "components": doc["components"]}).validate(response.json())


def test_every_route_that_answers_with_a_body_names_its_schema(app_client):
    doc = app_client.get("/api/v1/openapi.json").json()
    unnamed = [
        f"{method.upper()} {path} → {code}"
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
        for code, response in operation["responses"].items()
        if code.startswith("2")
        and code != "204"
        and "$ref" not in response["content"]["application/json"]["schema"]
    ]
    assert unnamed == []
    deployment = doc["components"]["schemas"]["Deployment"]["properties"]
    assert {"kind", "id", "generation", "status", "autoscaling"} <= set(deployment)


def _fleet(admin: Any) -> dict[str, Any]:
    """One object of every kind, a re-plan, and the events and audit entries they leave."""
    b.seed(admin)
    created = {
        "deployments": admin.post("deployments", b.deployment()),
        "tokens": admin.post("tokens", {"name": "ci", "role": "viewer"}),
        "clusters": admin.post("clusters", b.cluster("use1-b")),
    }
    for response in created.values():
        assert response.status_code == 201, response.text
    assert admin.patch("deployments/chat-llm", {"model_revision": "v2"}).status_code == 200
    return created


def test_real_responses_validate_against_the_declared_models(app_client, admin, session_factory):
    from controlplane.db import models as m

    created = _fleet(admin)
    with session_factory() as s, s.begin():
        cluster = s.query(m.Cluster).filter_by(name="use1-a").one()
        cluster.state = "healthy"
        cluster.status = {**cluster.status, "demand": {"chat-llm": 2}}
        s.query(m.Deployment).filter_by(name="chat-llm").one().demand_replicas = 2
        pool = s.query(m.Pool).filter_by(name="aws-use1-h100-od").one()
        instance = m.Instance(
            pool_id=pool.id,
            cluster_id=cluster.id,
            idempotency_key="k-1",
            gpus=8,
            state="running",
            provider_instance_id="i-1",
        )
        s.add(instance)
        s.flush()
        s.add(
            m.Replica(
                name="chat-llm-0",
                deployment_id=created["deployments"].json()["id"],
                cluster_id=cluster.id,
                instance_id=instance.id,
                state="ready",
            )
        )
    doc = app_client.get("/api/v1/openapi.json").json()
    answers: list[tuple[str, str, Any]] = [
        ("POST", "/api/v1/placement/replan", admin.post("placement/replan", {})),
        ("GET", "/api/v1/placement", admin.get("placement")),
        (
            "POST",
            "/api/v1/placement/preview",
            admin.post(
                "placement/preview",
                {"changes": [{"kind": "cluster", "name": "use1-a", "state": "down"}]},
            ),
        ),
        ("GET", "/healthz", app_client.get("/healthz")),
        ("GET", "/readyz", app_client.get("/readyz")),
        ("GET", "/api/v1/deployments/{ref}/revisions", admin.get("deployments/chat-llm/revisions")),
        ("PUT", "/api/v1/pools/{ref}", admin.put("pools/extra", b.pool("extra"))),
        *[("POST", f"/api/v1/{path}", r) for path, r in created.items()],
    ]
    collections = [
        "providers",
        "regions",
        "gpu-types",
        "pools",
        "clusters",
        "deployments",
        "tokens",
        "placements",
        "replicas",
        "instances",
        "events",
        "audit",
    ]
    for path in collections:
        page = admin.get(path)
        answers.append(("GET", f"/api/v1/{path}", page))
        items = page.json()["items"]
        assert items, f"the fleet has no {path}: the check would prove nothing"
        ref = "{ref}" if f"/api/v1/{path}/{{ref}}" in doc["paths"] else "{object_id}"
        answers.append(("GET", f"/api/v1/{path}/{ref}", admin.get(f"{path}/{items[0]['id']}")))

    for method, template, response in answers:
        assert response.status_code in (200, 201), f"{method} {template}: {response.text}"
        _check(doc, method, template, response)  # raises, naming the field, when they disagree
    placed = admin.get("placement").json()["deployments"]["chat-llm"]
    assert placed["placed_replicas"] == 2  # the check ran on a real placement, not an empty one
