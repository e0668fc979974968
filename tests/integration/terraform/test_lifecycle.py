"""Every resource through Terraform's life, against the real binary and a live API: init from
the mirror, plan, apply, no-change plan, in-place update, drift (changed and deleted out of
band), import (command and block), a concurrent change, refused deletes, replacement, destroy.

All seven resources live in one configuration, so each terraform command exercises every
resource at once (a launch costs ~1 s)."""

from __future__ import annotations

from typing import Any

from tests.integration.terraform.conftest import Api, Terraform

KINDS = {  # Terraform resource address → API path
    "gpufleet_provider.aws": "providers",
    "gpufleet_region.use1": "regions",
    "gpufleet_gpu_type.h100": "gpu-types",
    "gpufleet_pool.od": "pools",
    "gpufleet_cluster.a": "clusters",
    "gpufleet_deployment.chat": "deployments",
    "gpufleet_token.ci": "tokens",
}


def fleet(suffix: str = "", **v: Any) -> str:
    """The configuration; `v` overrides one value per resource for the update steps."""
    lifecycle = "lifecycle {\n    create_before_destroy = true\n  }" if suffix else ""
    return f"""
provider "gpufleet" {{}}

resource "gpufleet_provider" "aws" {{
  name           = "aws-main{suffix}"
  provider_kind  = "aws"
  provider_class = "hyperscaler"
  certifications = ["SOC2", "HIPAA"]
  labels         = {{ team = "{v.get("team", "infra")}" }}
  {lifecycle}
}}

resource "gpufleet_region" "use1" {{
  name         = "aws-us-east-1{suffix}"
  provider_name = gpufleet_provider.aws.name
  code         = "us-east-1"
  jurisdiction = "US"
  latitude     = {v.get("latitude", 38.9)}
  longitude    = -77.4
  {lifecycle}
}}

resource "gpufleet_gpu_type" "h100" {{
  name       = "H100-80G{suffix}"
  memory_gib = {v.get("memory_gib", 80)}
  {lifecycle}
}}

resource "gpufleet_pool" "od" {{
  name               = "aws-use1-h100-od{suffix}"
  provider_name      = gpufleet_provider.aws.name
  region             = gpufleet_region.use1.name
  gpu_type           = gpufleet_gpu_type.h100.name
  purchase_type      = "on_demand"
  gpus               = {v.get("gpus", 16)}
  price_per_gpu_hour = "{v.get("price", "6.88")}"
  quota_gpus         = 64
  {lifecycle}
}}

resource "gpufleet_cluster" "a" {{
  name     = "use1-a{suffix}"
  region   = gpufleet_region.use1.name
  pools    = [gpufleet_pool.od.name]
  cordoned = {v.get("cordoned", "false")}
  {lifecycle}
}}

resource "gpufleet_deployment" "chat" {{
  name             = "chat-llm{suffix}"
  model_id         = "meta-llama/Llama-3.1-8B-Instruct"
  gpus_per_replica = 1
  gpu_types        = [gpufleet_gpu_type.h100.name]
  traffic          = {{ (gpufleet_region.use1.name) = 1 }}
  autoscaling {{
    min_replicas       = 0
    max_replicas       = {v.get("max_replicas", 4)}
    target_concurrency = 16
    schedule {{
      start        = "08:00"
      end          = "18:00"
      min_replicas = 1
    }}
  }}
  placement {{
    allowed_jurisdictions = ["US"]
  }}
  {v.get("shadow", "")}
  force_destroy = true
  {lifecycle}
}}

resource "gpufleet_token" "ci" {{
  name        = "ci{suffix}"
  role        = "operator"
  description = "{v.get("description", "CI pipeline")}"
  {lifecycle}
}}

output "token" {{
  value     = gpufleet_token.ci.token
  sensitive = true
}}
"""


UPDATED: dict[str, Any] = {
    "team": "ml",
    "latitude": 39.0,
    "memory_gib": 96,
    "gpus": 24,
    "price": "7.1",
    "cordoned": "true",
    "max_replicas": 6,
    "description": "CI and CD",
    "shadow": 'shadow {\n    share        = 0.2\n    engine_image = "vllm/vllm-openai:v0.33.0"\n  }',
}


def ids(tf: Terraform) -> dict[str, str]:
    return {address: values["id"] for address, values in tf.state().items()}


def test_every_resource_created_updated_drifted_conflicting(terraform: Terraform, api: Api) -> None:
    tf = terraform
    tf.write(fleet())
    tf("init", "-input=false")
    assert "gpufleet.local/gpufleet/gpufleet" in (tf.workdir / ".terraform.lock.hcl").read_text()
    assert tf.plan_exit()[0] == 2

    tf.apply()
    created = ids(tf)
    assert set(created) == set(KINDS)
    assert api.get("/pools/aws-use1-h100-od")["price_per_gpu_hour"] == "6.880000"
    chat = api.get("/deployments/chat-llm")
    assert chat["autoscaling"]["max_replicas"] == 4
    assert chat["autoscaling"]["schedule"][0]["days"] == [0, 1, 2, 3, 4]
    secret = tf.output("token")
    assert secret.startswith("gpf_")
    assert "nats_credentials" in tf.state()["gpufleet_cluster.a"]
    assert tf.plan_exit()[0] == 0, "no perpetual diff after create"

    # in-place update of every resource: ids stay, generations move
    tf.write(fleet(**UPDATED))
    code, plan = tf.plan_exit()
    assert code == 2 and "7 to change, 0 to destroy" in plan, plan
    tf.apply()
    assert ids(tf) == created
    assert api.get("/providers/aws-main")["labels"] == {"team": "ml"}
    assert api.get("/pools/aws-use1-h100-od")["gpus"] == 24
    assert api.get("/deployments/chat-llm")["autoscaling"]["max_replicas"] == 6
    shadow = {"share": 0.2, "replicas": 1, "engine_image": "vllm/vllm-openai:v0.33.0"}
    assert api.get("/deployments/chat-llm")["shadow"] == shadow
    assert api.get("/tokens/ci")["description"] == "CI and CD"
    assert tf.plan_exit()[0] == 0
    assert tf.output("token") == secret, "the secret is kept after updates"

    # drift: every object changed out of band is planned back
    for path, change in (
        ("/providers/aws-main", {"labels": {"team": "rogue"}}),
        ("/regions/aws-us-east-1", {"latitude": 1.0}),
        ("/gpu-types/H100-80G", {"memory_gib": 81}),
        ("/pools/aws-use1-h100-od", {"gpus": 8}),
        ("/clusters/use1-a", {"cordoned": False}),
        ("/deployments/chat-llm", {"autoscaling": {"window_seconds": 120}}),
        ("/tokens/ci", {"description": "changed"}),
    ):
        api.patch(path, change)
    code, plan = tf.plan_exit()
    assert code == 2 and "7 to change" in plan, plan
    assert "window_seconds" in plan and "120" in plan
    tf.apply()
    assert api.get("/deployments/chat-llm")["autoscaling"]["window_seconds"] == 60
    assert api.get("/gpu-types/H100-80G")["memory_gib"] == 96
    assert tf.plan_exit()[0] == 0

    # a concurrent change between plan and apply is a conflict, not an overwrite
    conflicting: dict[str, Any] = UPDATED | {"gpus": 32}
    tf.write(fleet(**conflicting))
    tf("plan", "-out=tfplan", "-input=false")
    api.patch("/pools/aws-use1-h100-od", {"gpus": 40})
    result = tf("apply", "-input=false", "tfplan", check=False)
    assert result.returncode == 1
    assert "changed by someone else" in result.stderr and "generation" in result.stderr
    assert api.get("/pools/aws-use1-h100-od")["gpus"] == 40
    tf.apply()
    assert api.get("/pools/aws-use1-h100-od")["gpus"] == 32
    tf("destroy", "-auto-approve", "-input=false")
    assert api.names("pools") == []


def test_every_resource_deleted_imported_refused_replaced(terraform: Terraform, api: Api) -> None:
    tf = terraform
    tf.write(fleet())
    tf("init", "-input=false")
    tf.apply()
    created = ids(tf)

    # deleted out of band: gone from state, planned and created again
    for address in reversed(KINDS):
        api.delete(f"/{KINDS[address]}/{created[address]}")
    code, plan = tf.plan_exit()
    assert code == 2 and "7 to add" in plan and "has been deleted" in plan, plan
    tf.apply()
    recreated = ids(tf)
    assert all(recreated[a] != created[a] for a in KINDS)
    assert tf.plan_exit()[0] == 0

    # import: by id with import {} blocks, by name with the command
    tf("state", "rm", *KINDS)
    blocks = "".join(
        f'\nimport {{\n  to = {a}\n  id = "{recreated[a]}"\n}}\n' for a in KINDS if "pool" not in a
    )
    tf.write(fleet() + blocks)
    tf("import", "-input=false", "gpufleet_pool.od", "aws-use1-h100-od")
    result = tf.apply()
    assert "6 imported" in result.stdout, result.stdout
    assert ids(tf) == recreated
    tf.write(fleet())
    assert tf.plan_exit()[0] == 0, "an imported fleet plans no change"

    # refused deletes are explained: a GPU type a pool outside Terraform uses
    api.post(
        "/pools",
        {
            "name": "outside",
            "provider": "aws-main",
            "region": "aws-us-east-1",
            "gpu_type": "H100-80G",
            "purchase_type": "spot",
            "gpus": 1,
            "price_per_gpu_hour": "1",
        },
    )
    result = tf("destroy", "-auto-approve", "-input=false", check=False)
    assert result.returncode == 1
    assert "refuses: it is in use" in result.stderr and "outside" in result.stderr, result.stderr
    api.delete("/pools/outside")  # what depended on the GPU type was destroyed before it

    # replacement: a new name replaces each object (create before destroy keeps refs valid)
    tf.write(fleet(suffix="-2"))
    code, plan = tf.plan_exit()
    assert code == 2 and "7 to add, 0 to change, 3 to destroy" in plan, plan
    assert plan.count("forces replacement") == 3, plan
    tf.apply()
    assert api.names("providers") == ["aws-main-2"]
    assert api.names("deployments") == ["chat-llm-2"]
    assert tf.plan_exit()[0] == 0

    tf("destroy", "-auto-approve", "-input=false")
    for path in set(KINDS.values()) - {"tokens"}:
        assert api.names(path) == [], path
    assert "ci-2" not in api.names("tokens")
