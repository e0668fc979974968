"""Stories of a platform engineer managing the fleet inventory through the admin API."""

from __future__ import annotations

import pytest

from tests.integration.api import builders as b


def test_create_get_by_id_and_name_list_and_delete_a_pool(operator, admin):
    b.seed(admin)
    created = operator.post(
        "pools",
        b.pool(
            "aws-use1-h100-spot",
            purchase_type="spot",
            quota_gpus=None,
            interruptions_per_hour="0.05",
            notice_seconds=120,
        ),
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["generation"] == 1
    assert body["price_per_gpu_hour"] == "3.933750"  # exact decimal, as a string
    assert created.headers["etag"] == '"1"'

    assert operator.get(f"pools/{body['id']}").json()["name"] == "aws-use1-h100-spot"
    assert operator.get("pools/aws-use1-h100-spot").json()["id"] == body["id"]
    names = [p["name"] for p in operator.get("pools").json()["items"]]
    assert names == ["aws-use1-h100-od", "aws-use1-h100-spot"]

    assert operator.delete("pools/aws-use1-h100-spot").status_code == 204
    missing = operator.get("pools/aws-use1-h100-spot")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"


def test_list_filters_and_pagination_walk_every_object_once(admin):
    b.seed(admin)
    for i in range(7):
        kind = "spot" if i % 2 else "on_demand"
        extra = {"quota_gpus": None, "interruptions_per_hour": "0.1"} if kind == "spot" else {}
        assert admin.post("pools", b.pool(f"p-{i}", purchase_type=kind, **extra)).status_code == 201

    spot = admin.get("pools", purchase_type="spot").json()["items"]
    assert [p["name"] for p in spot] == ["p-1", "p-3", "p-5"]
    assert admin.get("pools", region="aws-us-east-1", gpu_type="H100-80G").json()["items"]

    seen, cursor = [], None
    while True:
        page = admin.get("pools", limit=3, **({"cursor": cursor} if cursor else {})).json()
        seen += [p["name"] for p in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(["aws-use1-h100-od"] + [f"p-{i}" for i in range(7)])

    unknown = admin.get("pools", colour="blue")
    assert unknown.status_code == 400
    assert "allowed filters" in unknown.json()["detail"]


def test_put_is_idempotent_and_patch_bumps_generation_only_on_change(operator, admin):
    b.seed(admin)
    body = b.deployment()
    first = operator.put("deployments/chat-llm", body)
    assert first.status_code == 201
    again = operator.put("deployments/chat-llm", body)
    assert again.status_code == 200
    assert again.json()["generation"] == 1

    patched = operator.patch("deployments/chat-llm", {"autoscaling": {"max_replicas": 8}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["generation"] == 2
    assert patched.json()["autoscaling"]["max_replicas"] == 8
    assert patched.json()["autoscaling"]["min_replicas"] == 1  # merge patch keeps the rest
    assert patched.json()["status"]["revision"] == 1  # scaling is not a new revision

    new_model = operator.patch("deployments/chat-llm", {"model_revision": "v2"})
    assert new_model.json()["status"]["revision"] == 2
    revisions = operator.get("deployments/chat-llm/revisions").json()["items"]
    assert [r["revision"] for r in revisions] == [1, 2]
    assert revisions[1]["spec"]["model_revision"] == "v2"


def test_stale_if_match_is_a_conflict_and_fresh_one_succeeds(operator, admin):
    b.seed(admin)
    current = operator.get("clusters/use1-a")
    etag = current.headers["etag"]
    ok = operator.patch("clusters/use1-a", {"cordoned": True}, **{"If-Match": etag})
    assert ok.status_code == 200
    stale = operator.patch("clusters/use1-a", {"cordoned": False}, **{"If-Match": etag})
    assert stale.status_code == 409
    assert "generation 2, not 1" in stale.json()["detail"]
    assert operator.delete("clusters/use1-a", **{"If-Match": '"1"'}).status_code == 409


@pytest.mark.parametrize(
    ("path", "body", "field", "hint"),
    [
        ("pools", b.pool(gpus=-1), "gpus", "greater than or equal to 0"),
        ("pools", b.pool(price_per_gpu_hour="-0.5"), "price_per_gpu_hour", "greater than or equal"),
        ("pools", b.pool("p-new", gpu_type="TPU-v9"), "gpu_type", "known: H100-80G"),
        ("pools", b.reserved_pool(term_end="2025-01-01T00:00:00Z"), "term_end", "must be after term_start"),
        ("pools", b.pool("p-new", notice_seconds=30), "notice_seconds", "applies to spot pools only"),
        ("pools", b.reserved_pool("p-new", committed_gpus=None), "body", "needs committed_gpus"),
        ("pools", b.pool("p-new", region="nowhere"), "region", "no region named 'nowhere'"),
        ("deployments", b.deployment(autoscaling={"min_replicas": 4, "max_replicas": 2}),
         "autoscaling.max_replicas", "raise max_replicas"),
        ("deployments", b.deployment(placement={"allowed_jurisdictions": ["XX"]}),
         "placement.allowed_jurisdictions", "ISO 3166-1"),
        ("deployments", b.deployment(gpu_types=["B300"]), "gpu_types[0]", "unknown GPU type"),
        ("regions", b.region("gcp-x", jurisdiction="ZZ"), "jurisdiction", "ISO 3166-1"),
        ("providers", b.provider("p2", credentials_ref="AKIAIOSFODNN7EXAMPLE"), "credentials_ref", "pattern"),
        ("providers", b.provider("p3", colour="red"), "colour", "unknown field"),
    ],
)  # fmt: skip
def test_validation_errors_name_the_field_and_the_fix(admin, path, body, field, hint):
    b.seed(admin)
    response = admin.post(path, body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert response.headers["content-type"] == "application/problem+json"
    fields = {e["field"]: e["message"] for e in problem["errors"]}
    assert field in fields, problem
    assert hint in fields[field]


def test_bad_json_is_a_400_problem_not_a_500(admin):
    response = admin.client.post(
        "/api/v1/providers",
        content=b"{not json",
        headers=admin.headers | {"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["detail"]


def test_deleting_something_in_use_is_a_conflict_with_the_reason(admin):
    b.seed(admin)
    provider = admin.delete("providers/aws-main")
    assert provider.status_code == 409
    assert "aws-use1-h100-od" in provider.json()["detail"]
    pool = admin.delete("pools/aws-use1-h100-od")
    assert pool.status_code == 409
    assert "use1-a" in pool.json()["detail"]
    gpu = admin.delete("gpu-types/H100-80G")
    assert gpu.status_code == 409


def test_deleting_a_deployment_with_replicas_needs_force(admin, session_factory):
    from controlplane.db import models as m

    b.seed(admin)
    dep = admin.post("deployments", b.deployment()).json()
    cluster = admin.get("clusters/use1-a").json()
    with session_factory() as s, s.begin():
        s.add(m.Replica(name="chat-llm-0", deployment_id=dep["id"], cluster_id=cluster["id"]))
    refused = admin.delete("deployments/chat-llm")
    assert refused.status_code == 409
    assert "?force=true" in refused.json()["detail"]
    assert admin.delete("deployments/chat-llm?force=true").status_code == 204
    assert admin.get("replicas").json()["items"] == []


def test_a_duplicate_name_is_a_conflict_pointing_to_put(admin):
    b.seed(admin)
    again = admin.post("providers", b.provider())
    assert again.status_code == 409
    assert "PUT /api/v1/providers/aws-main" in again.json()["detail"]


def test_read_only_collections_list_and_filter(admin, session_factory):
    from controlplane.db import models as m

    b.seed(admin)
    with session_factory() as s, s.begin():
        s.add(m.Event(type="ClusterDown", object_kind="Cluster", object_name="use1-a", message="x"))
        s.add(m.Event(type="PlacementChanged", object_kind="Placement", message="y"))
    events = admin.get("events", object_kind="Cluster").json()["items"]
    assert [e["type"] for e in events] == ["ClusterDown"]
    assert admin.get("events", limit=1).json()["next_cursor"] is not None


def test_health_needs_no_token_and_readiness_checks_the_database(app_client):
    assert app_client.get("/healthz").json() == {"status": "ok"}
    assert app_client.get("/readyz").status_code == 200
    assert "/api/v1/pools" in app_client.get("/api/v1/openapi.json").json()["paths"]


def test_every_object_says_its_kind_and_a_provider_its_cloud(admin):
    b.seed(admin)
    provider = admin.get("providers/aws-main").json()
    assert (provider["kind"], provider["provider_kind"]) == ("Provider", "aws")
    assert admin.get("gpu-types/H100-80G").json()["kind"] == "GpuType"
    assert [p["name"] for p in admin.get("providers", provider_kind="aws").json()["items"]] == [
        "aws-main"
    ]


def test_put_of_an_unchanged_pool_with_a_short_decimal_is_a_no_op(admin):
    b.seed(admin)
    body = b.pool("p-dec", price_per_gpu_hour="3.93375")
    assert admin.put("pools/p-dec", body).json()["generation"] == 1
    again = admin.put("pools/p-dec", body)
    assert again.json()["generation"] == 1
    assert len(admin.get("audit", resource_name="p-dec").json()["items"]) == 1


def test_changes_placement_depends_on_ask_for_a_replan_and_others_do_not(
    database_url, session_factory, engine
):
    from fastapi.testclient import TestClient

    from controlplane.api.app import create_app
    from controlplane.services import inventory
    from controlplane.services.resources import KINDS
    from controlplane.settings import Settings
    from tests.integration.conftest import Api, _truncate

    asked: list[str] = []
    _truncate(engine)
    with session_factory() as s, s.begin():
        spec = KINDS["tokens"].spec.model_validate({"name": "root", "role": "admin"})
        created = inventory.create(s, KINDS["tokens"], spec, inventory.Actor("t"))
    assert created.secrets is not None
    token = created.secrets["token"]
    app = create_app(
        Settings(database_url=database_url), session_factory, on_inventory_change=asked.append
    )
    with TestClient(app) as client:
        api = Api(client, token)
        b.seed(api)
        assert asked == ["Provider", "Region", "Pool", "Cluster"]  # not the GPU type
        api.patch("pools/aws-use1-h100-od", {"gpus": 64})  # unchanged: nothing to re-plan
        api.post("tokens", {"name": "ci", "role": "viewer"})
        assert asked == ["Provider", "Region", "Pool", "Cluster"]
        api.patch("providers/aws-main", {"certifications": ["SOC2"]})
        assert asked[-1] == "Provider"
    _truncate(engine)


def test_a_deprecated_knob_spelling_is_accepted_and_answered_with_the_one_spelling(admin):
    b.seed(admin)
    old = {"min_replicas": 1, "max_replicas": 4, "concurrency_target": 16, "window_s": 30}
    created = admin.post(
        "deployments", b.deployment(autoscaling=old, placement={"min_providers": 1})
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["autoscaling"]["target_concurrency"] == 16.0
    assert body["autoscaling"]["window_seconds"] == 30.0
    assert body["placement"]["min_distinct_providers"] == 1
    assert "concurrency_target" not in body["autoscaling"]
    # the same spec in the new spelling is no change at all
    new = {"min_replicas": 1, "max_replicas": 4, "target_concurrency": 16, "window_seconds": 30}
    again = admin.put("deployments/chat-llm", b.deployment(autoscaling=new))
    assert again.json()["generation"] == 1

    unset = admin.post("deployments", b.deployment("other-llm")).json()
    assert unset["autoscaling"]["target_concurrency"] == 8.0  # docs/api.md's default

    both = admin.post(
        "deployments",
        b.deployment("both", autoscaling={"target_concurrency": 4, "concurrency_target": 16}),
    )
    assert both.status_code == 422
    assert "send only `target_concurrency`" in both.json()["detail"]


def _holding(admin, session_factory, state: str = "running") -> str:
    """The seeded pool with one instance in `state`; its instance row's id."""
    from controlplane.db import models as m

    b.seed(admin)
    with session_factory() as s, s.begin():
        cluster = s.query(m.Cluster).filter_by(name="use1-a").one()
        pool = s.query(m.Pool).one()
        instance = m.Instance(pool_id=pool.id, cluster_id=cluster.id, idempotency_key="k",
                              gpus=8, state=state)  # fmt: skip
        s.add(instance)
        s.flush()
        return instance.id


def test_what_a_pools_instances_are_cannot_change_under_them(admin, session_factory):
    """A pool moved to another provider (or purchase type, region, size) while it held
    instances: the sweeps asked the new provider for them, marked them gone and bought
    replacements, and the old ones billed for ever."""
    _holding(admin, session_factory)
    for change in ({"purchase_type": "spot", "quota_gpus": None}, {"gpus_per_instance": 4}):
        answer = admin.patch("pools/aws-use1-h100-od", change)
        assert answer.status_code == 409, answer.text
        assert "holds 1 instance(s)" in answer.json()["detail"]
        assert next(iter(change)) in answer.json()["detail"]
    assert admin.patch("pools/aws-use1-h100-od", {"price_per_gpu_hour": "3.5"}).status_code == 200
    changed = admin.patch("providers/aws-main", {"provider_kind": "gcp"})
    assert changed.status_code == 409 and "provider_kind" in changed.json()["detail"]


def test_a_pool_whose_instances_all_ended_can_be_deleted(admin, session_factory):
    """Its rows stay (history); it was refused for ever (the filter named a state, 'terminated',
    that no instance ever has)."""
    from controlplane.db import models as m

    instance = _holding(admin, session_factory)
    assert admin.patch("clusters/use1-a", {"pools": []}).status_code == 200
    held = admin.delete("pools/aws-use1-h100-od")
    assert held.status_code == 409 and "still holds 1 instance(s)" in held.json()["detail"]
    with session_factory() as s, s.begin():
        s.get_one(m.Instance, instance).state = "released"
    answer = admin.delete("pools/aws-use1-h100-od")
    assert answer.status_code == 204, answer.text


def test_records_page_through_their_cursors(admin, session_factory):
    """Following any next_cursor on events, audit, replicas, instances or placements was a
    500 (the cursor's time compared as text with a timestamptz column)."""
    from controlplane.db import models as m

    b.seed(admin)
    with session_factory() as s, s.begin():
        for i in range(5):
            s.add(m.Event(type="ClusterDown", object_kind="Cluster", object_name=f"c{i}",
                          message="x"))  # fmt: skip
    seen, cursor = [], None
    for _ in range(10):
        answer = admin.get("events", limit=2, **({"cursor": cursor} if cursor else {}))
        assert answer.status_code == 200, answer.text
        page = answer.json()
        seen += [e["id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) >= 5
    audit = admin.get("audit", limit=1).json()
    assert admin.get("audit", limit=1, cursor=audit["next_cursor"]).status_code == 200


@pytest.mark.parametrize("path", ["pools", "tokens", "events", "audit"])
def test_a_forged_cursor_is_a_400_not_a_500(admin, path):
    import base64

    forged = ["AA"]  # decodes to a NUL, which reached PostgreSQL: a 500
    if path in ("events", "audit"):  # a (time, id) pair whose time is not one
        forged.append(base64.urlsafe_b64encode(b"not-a-time|x").decode())
    for cursor in forged:
        answer = admin.get(path, cursor=cursor)
        assert answer.status_code == 400, (cursor, answer.text)
        assert "pass next_cursor from the previous page" in answer.json()["detail"]


def test_a_time_that_overflows_is_a_422_naming_the_parameter(admin):
    answer = admin.get(
        "costs", **{"from": "0001-01-01T00:00:00+01:00", "to": "2026-01-02T00:00:00Z"}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"].endswith("from")


@pytest.mark.parametrize(
    "endpoint",
    ["http://10.0.0.5:8500/v1/internal?x=", "http://10.0.0.5:8500/x?", "http://u:p@10.0.0.5:8100",
     "http://10.0.0.5:8100/#x"],
)  # fmt: skip
def test_a_cluster_endpoint_is_a_base_url_only(admin, endpoint):
    """The dashboard's playground (any viewer) appends `/v1/chat/completions` to it: with a
    query, that path became a parameter and the POST went to whatever URL an operator named."""
    b.seed(admin)
    answer = admin.patch("clusters/use1-a", {"endpoint": endpoint})
    assert answer.status_code == 422, answer.text
    assert "base URL only" in answer.json()["errors"][0]["message"]
    assert admin.patch("clusters/use1-a", {"endpoint": "http://10.0.0.5:8100"}).status_code == 200


def test_revisions_come_in_pages_and_the_next_number_is_never_reused(operator, admin):
    """Every revision came in one answer (each holds up to 32 KiB of engine_args), and each
    change loaded all of them to number the next."""
    b.seed(admin)
    assert operator.post("deployments", b.deployment()).status_code == 201
    for i in range(2, 8):
        changed = operator.patch("deployments/chat-llm", {"model_revision": f"v{i}"})
        assert changed.json()["status"]["revision"] == i
    seen, cursor = [], None
    while True:
        page = operator.get("deployments/chat-llm/revisions", limit=3, **(
            {"cursor": cursor} if cursor else {})).json()  # fmt: skip
        seen += [r["revision"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [1, 2, 3, 4, 5, 6, 7]
    forged = operator.get("deployments/chat-llm/revisions", cursor="bm90IGEgbnVtYmVy")
    assert forged.status_code == 400 and "cursor is not valid" in forged.json()["detail"]
