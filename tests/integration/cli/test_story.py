"""An operator's day with the CLI: apply → get → diff → edit → diff → apply → describe → delete."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from tests.integration.cli.conftest import Cli

FLEET = """\
# A small fleet, deliberately out of dependency order: apply sorts it.
kind: Deployment
name: chat-llm
model_id: meta-llama/Llama-3.1-8B-Instruct
gpus_per_replica: 1
gpu_types: [H100-80G]
autoscaling: {min_replicas: 1, max_replicas: 4}
placement: {allowed_jurisdictions: [US]}
---
kind: Pool
name: aws-use1-h100-od
provider: aws-main
region: aws-us-east-1
gpu_type: H100-80G
purchase_type: on_demand
gpus: 64
price_per_gpu_hour: 3.93375
quota_gpus: 128
---
kind: Cluster
name: use1-a
region: aws-us-east-1
pools: [aws-use1-h100-od]
---
kind: List
items:
  - {kind: GpuType, name: H100-80G, memory_gib: 80}
  - kind: Region
    name: aws-us-east-1
    provider: aws-main
    code: us-east-1
    jurisdiction: US
    latitude: 38.9
    longitude: -77.4
---
kind: Provider
name: aws-main
provider_kind: aws
provider_class: hyperscaler
certifications: [SOC2, HIPAA]
"""


def test_apply_get_diff_edit_apply_describe_delete(
    cli: Cli, tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)

    applied = cli("apply", "-f", str(fleet), "--yes")
    assert applied.exit_code == 0, applied.output
    order = [line.split()[0] for line in applied.output.splitlines() if " created " in line]
    assert order == [
        "providers/aws-main",
        "gpu-types/H100-80G",
        "regions/aws-us-east-1",
        "pools/aws-use1-h100-od",
        "clusters/use1-a",
        "deployments/chat-llm",
    ]
    assert "6 to create, 0 to update, 0 unchanged" in applied.output
    # the new cluster's agent logs in with these, and nothing can show them again
    (line,) = [x for x in applied.output.splitlines() if "NATS credentials (shown once" in x]
    creds = json.loads(line.split(": ", 1)[1])
    assert creds["user"] == "cluster-use1-a" and len(creds["password"]) >= 32

    pools = cli("get", "pools")
    assert pools.exit_code == 0, pools.output
    header, row = pools.output.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "PROVIDER", "REGION", "GPU"]
    assert row.split() == [
        "aws-use1-h100-od",
        "aws-main",
        "aws-us-east-1",
        "H100-80G",
        "on_demand",
        "64",
        "3.933750",
    ]
    deploys = cli("get", "deploy")
    assert "chat-llm" in deploys.output and "1–4" in deploys.output

    same = cli("diff", "-f", str(fleet))
    assert same.exit_code == 0, same.output
    assert "0 to create, 0 to update, 6 unchanged" in same.output

    again = cli("apply", "-f", str(fleet))  # no --yes needed: nothing to ask about
    assert again.exit_code == 0, again.output
    assert "nothing to apply" in again.output
    assert _generation(cli, "pool", "aws-use1-h100-od") == 1

    edited = FLEET.replace("gpus: 64", "gpus: 96").replace("max_replicas: 4", "max_replicas: 8")
    fleet.write_text(edited)
    changed = cli("diff", "-f", str(fleet))
    assert changed.exit_code == 1, changed.output
    assert "~ update    pools/aws-use1-h100-od" in changed.output
    assert "gpus: 64 → 96" in changed.output
    assert "autoscaling.max_replicas: 4 → 8" in changed.output
    assert "0 to create, 2 to update, 4 unchanged" in changed.output

    updated = cli("apply", "-f", str(fleet), "--yes")
    assert updated.exit_code == 0, updated.output
    assert "pools/aws-use1-h100-od updated (generation 2)" in updated.output
    assert cli("diff", "-f", str(fleet)).exit_code == 0

    _record_event(session_factory, "Deployment", "chat-llm", "Scaled", "scaled to 2 replicas")
    described = cli("describe", "deployment", "chat-llm")
    assert described.exit_code == 0, described.output
    text = described.output
    assert text.startswith("Deployment: chat-llm")
    assert "max_replicas: 8" in text and "revision: 1" in text
    assert "Scaled" in text and "scaled to 2 replicas" in text

    deleted = cli("delete", "deployment", "chat-llm")
    assert deleted.exit_code == 0, deleted.output
    gone = cli("get", "deployment", "chat-llm")
    assert gone.exit_code == 1
    assert gone.output.strip() == (
        "error: deployments 'chat-llm' not found; list them with `gpufleet get deployments`"
    )
    assert cli("diff", "-f", str(fleet)).exit_code == 1


def test_get_yaml_is_a_reapplyable_manifest(cli: Cli, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    assert cli("apply", "-f", str(fleet), "--yes").exit_code == 0

    exported = tmp_path / "exported.yaml"
    for kind in ("providers", "gpu-types", "regions", "pools", "clusters", "deployments"):
        result = cli("get", kind, "-o", "yaml")
        assert result.exit_code == 0, result.output
        exported.write_text(
            exported.read_text() + "---\n" + result.output if exported.exists() else result.output
        )
    docs = list(yaml.safe_load_all(exported.read_text()))
    assert {d["kind"] for d in docs} == {
        "Provider",
        "GpuType",
        "Region",
        "Pool",
        "Cluster",
        "Deployment",
    }
    assert all("status" not in d and "generation" not in d for d in docs)
    same = cli("diff", "-f", str(exported))
    assert same.exit_code == 0, same.output

    one = json.loads(cli("get", "pool", "aws-use1-h100-od", "-o", "json").output)
    assert one["kind"] == "Pool" and one["gpus"] == 64
    names = cli("get", "gpu-types", "-o", "name").output
    assert names == "gputype/H100-80G\n"


def test_delete_by_file_in_reverse_order_and_stdin_apply(cli: Cli, tmp_path: Path) -> None:
    applied = cli("apply", "-f", "-", "--yes", input=FLEET)
    assert applied.exit_code == 0, applied.output
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)

    deleted = cli("delete", "-f", str(fleet))
    assert deleted.exit_code == 0, deleted.output
    first = [line.split()[0] for line in deleted.output.splitlines()]
    assert first[0] == "deployments/chat-llm" and first[-1] == "providers/aws-main"
    assert "6 to create" in cli("diff", "-f", str(fleet)).output


def _generation(cli: Cli, kind: str, name: str) -> int:
    return json.loads(cli("get", kind, name, "-o", "json").output)["generation"]


def _record_event(
    factory: sessionmaker[Session], kind: str, name: str, type_: str, message: str
) -> None:
    with factory() as session, session.begin():
        session.add(m.Event(type=type_, object_kind=kind, object_name=name, message=message))


def test_demo_fleet_applies_and_then_shows_no_difference(cli: Cli) -> None:
    demo = Path(__file__).parents[3] / "infra" / "examples" / "fleet.yaml"
    applied = cli("apply", "-f", str(demo), "--yes")
    assert applied.exit_code == 0, applied.output
    same = cli("diff", "-f", str(demo))  # "2.10" vs "2.100000", "…Z" vs "…+00:00"
    assert same.exit_code == 0, same.output
