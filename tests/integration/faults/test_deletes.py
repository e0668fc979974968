"""Issue 12 item 1: deleting something must reach its plane. A force-deleted deployment was
no longer listed by the API while its plane served it for 13+ minutes (and started it again
after a restart): the delete did not bump the cluster's desired generation."""

from __future__ import annotations

from tests.integration.faults.conftest import Fleet
from tests.integration.test_up import _wait_until


def test_deleting_a_deployment_stops_it_on_its_plane(fleet: Fleet) -> None:
    cluster = fleet.serving("triage-llm")
    spec = fleet.api.get("/api/v1/deployments/triage-llm").json()
    body = {
        k: v
        for k, v in spec.items()
        if k not in {"kind", "id", "generation", "status", "created_at", "updated_at"}
    }
    assert fleet.api.delete("/api/v1/deployments/triage-llm?force=true").status_code == 204
    try:
        _wait_until(
            lambda: "triage-llm" not in fleet.models(cluster),
            30,
            f"{cluster} to stop serving the deleted deployment",
        )
        record = fleet.up.data_dir / "agents" / cluster / "runtime" / "replicas.json"
        _wait_until(
            lambda: "triage-llm" not in record.read_text(),
            30,
            f"{cluster}'s agent to stop the deleted deployment's replicas",
        )
    finally:  # made again under the same name, for the tests after this one
        assert fleet.api.put("/api/v1/deployments/triage-llm", json=body).status_code == 201
    fleet.serving("triage-llm")
