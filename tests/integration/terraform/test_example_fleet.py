"""infra/terraform/examples/fleet through the real terraform binary ends with exactly the fleet
`gpufleet apply -f infra/examples/fleet.yaml` produces (`gpufleet diff` finds nothing to do and
no object more), and its data sources read placement, offers and observed state."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.columns import set_status
from controlplane.db.models import Pool
from tests.integration.cli.conftest import Cli
from tests.integration.terraform.conftest import ROOT, Api, Terraform

EXAMPLE = ROOT / "infra" / "terraform" / "examples" / "fleet"
ADOPT = ROOT / "infra" / "terraform" / "examples" / "adopt" / "imports.tf"
FLEET_YAML = ROOT / "infra" / "examples" / "fleet.yaml"
PATHS = {
    "Provider": "providers",
    "GpuType": "gpu-types",
    "Region": "regions",
    "Pool": "pools",
    "Cluster": "clusters",
    "Deployment": "deployments",
}

DATA = """
data "gpufleet_placement" "triage" {
  deployment = gpufleet_deployment.triage_llm.name
}

data "gpufleet_offers" "spot" {
  provider_name = "aws-main"
  purchase_type = "spot"
}

output "triage" {
  value = data.gpufleet_placement.triage
}

output "spot_offers" {
  value = data.gpufleet_offers.spot.offers
}
"""


def test_example_fleet_is_the_yaml_fleet(
    terraform: Terraform,
    api: Api,
    tokens: dict[str, str],
    session_factory: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    tf = terraform
    for source in EXAMPLE.glob("*.tf"):
        shutil.copy(source, tf.workdir / source.name)
    tf("init", "-input=false")
    started = time.monotonic()
    code, _ = tf.plan_exit()
    planned = time.monotonic()
    tf.apply()
    applied = time.monotonic()
    print(f"example fleet: plan {planned - started:.1f} s, apply {applied - planned:.1f} s")
    assert code == 2

    cli = Cli(tf.env["GPUFLEET_URL"], tokens["admin"], tmp_path / "cli.yaml")
    diff = cli("diff", "-f", str(FLEET_YAML))
    assert diff.exit_code == 0, diff.output
    wanted: dict[str, list[str]] = {}
    for doc in yaml.safe_load_all(FLEET_YAML.read_text()):
        wanted.setdefault(PATHS[doc["kind"]], []).append(doc["name"])
    for path, names in wanted.items():
        assert api.names(path) == sorted(names), path
    assert tf.plan_exit()[0] == 0

    assert tf.output("gpu_types") == {"H100-80G": 80, "L40S-48G": 48}
    assert tf.output("use1_a_state") == "pending"
    assert set(tf.output("use1_a_nats_credentials")) == {"user", "password", "inbox_prefix"}

    # the data sources: a re-plan has run; procurement has priced the spot pool
    replan = api.http.post("/placement/replan")
    assert replan.status_code == 200, replan.text
    with session_factory() as session, session.begin():
        pool = session.scalars(select(Pool).where(Pool.name == "aws-use1-l40s-spot")).one()
        set_status(
            pool, offer={"instance_type": "g6e.xlarge", "spot_price": 0.9, "available": True}
        )
    (tf.workdir / "data.tf").write_text(DATA)
    tf.apply()
    triage = tf.output("triage")
    assert triage["wanted_replicas"] == 2  # its min; no plane has sent a heartbeat yet, so
    unplaced = sum(int(u["replicas"]) for u in triage["unplaced"])  # each gap has its reason
    assert triage["placed_replicas"] + unplaced == 2 and all(
        u["reason"] for u in triage["unplaced"]
    )
    [offer] = tf.output("spot_offers")
    assert offer["pool"] == "aws-use1-l40s-spot" and offer["spot_price"] == "0.9"
    assert offer["price_per_gpu_hour"] == "0.930000" and offer["available"] == "true"
    tf("destroy", "-auto-approve", "-input=false")
    assert api.names("pools") == []

    # adopting the fleet `make up` loads (docs/terraform.md): the CLI writes it, Terraform
    # imports every object by name and then plans nothing
    (tf.workdir / "data.tf").unlink()
    assert cli("apply", "-f", str(FLEET_YAML), "--yes").exit_code == 0
    shutil.copy(ADOPT, tf.workdir / ADOPT.name)
    result = tf.apply()
    assert "21 imported, 0 added" in result.stdout, result.stdout
    assert tf.plan_exit()[0] == 0
    assert cli("diff", "-f", str(FLEET_YAML)).exit_code == 0
