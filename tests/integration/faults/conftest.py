"""One `gpufleet up` fleet for the fault suite (starting one costs ~30 s): its PostgreSQL is
owned by the suite so that an outage can be made and ended at will; `up` ticks every second;
clusters go stale after 12 s and down after 20 s of silence (instead of 15/60 s), so that a
blind spot of the control plane shows within a test."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from controlplane.local.ports import free_port_block
from controlplane.local.postgres import EmbeddedPostgres
from tests.integration.test_up import READY, Up, _wait_until

CLUSTERS = ("euc1-a", "local-a", "use1-a")
"""The demo fleet's clusters; `up` serves cluster i's router on router_base + i."""


class Fleet:
    def __init__(self, up: Up, postgres: EmbeddedPostgres, ports: dict[str, int]) -> None:
        self.up, self.postgres, self.ports = up, postgres, ports
        token = re.search(r"admin token \(shown once, keep it\): (gpf_\S+)", up.output)
        assert token, up.output
        self.token = token[1]
        self.api = httpx.Client(
            base_url=up.api, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )

    def child(self, mark: str) -> psutil.Process:
        """The child of `up` whose command line contains `mark`."""
        kids = psutil.Process(self.up.proc.pid).children()
        found = [p for p in kids if mark in " ".join(p.cmdline())]
        assert len(found) == 1, [p.cmdline() for p in kids]
        return found[0]

    def says(self, text: str, timeout_s: float = 30) -> None:
        self.up.wait_for(text, timeout_s)

    def router_serves(self) -> bool:
        """A plane's router answers from what it has (static stability)."""
        url = f"http://127.0.0.1:{self.ports['router_base']}/v1/models"
        return httpx.get(url, timeout=5).status_code == 200

    def agent_metrics(self, cluster: str) -> str:
        """Where the cluster's agent serves its own metrics (the routers are processes apart)."""
        return (
            f"http://127.0.0.1:{self.ports['metrics_base'] + 10 + CLUSTERS.index(cluster)}/metrics"
        )

    def serving(self, deployment: str, timeout_s: float = 90) -> str:
        """The cluster whose router serves `deployment` (waits until one does)."""
        found: list[str] = []

        def check() -> bool:
            found[:] = [c for c in CLUSTERS if deployment in self.models(c)]
            return bool(found)

        _wait_until(check, timeout_s, f"a plane to serve {deployment}")
        return found[0]

    def router(self, cluster: str) -> str:
        return f"http://127.0.0.1:{self.ports['router_base'] + CLUSTERS.index(cluster)}"

    def models(self, cluster: str) -> set[str]:
        """What the cluster's router serves now (/v1/models)."""
        answer = httpx.get(self.router(cluster) + "/v1/models", timeout=10)
        answer.raise_for_status()
        return {m["id"] for m in answer.json()["data"]}

    def replica_pids(self, cluster: str) -> dict[str, int]:
        """The replica processes the cluster's agent runs (its runtime's record); a replica
        recorded before its process has started (no pid yet) is not running."""
        record = self.up.data_dir / "agents" / cluster / "runtime" / "replicas.json"
        if not record.exists():
            return {}
        return {
            r["replica_id"]: int(r["pid"])
            for r in json.loads(record.read_text())
            if r.get("pid") is not None
        }

    def nats_credentials(self, who: str) -> dict[str, str]:
        """A party's NATS login from `up`'s secrets: "controlplane" or a cluster's name."""
        name = "nats-controlplane.json" if who == "controlplane" else f"cluster-{who}.json"
        return json.loads((self.up.data_dir / "secrets" / name).read_text())

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.ports['nats']}"


@pytest.fixture(scope="package")
def fleet() -> Iterator[Fleet]:
    first = free_port_block(40)
    names = ("api", "postgres", "nats", "redis", "router_base")
    ports = {name: first + i for i, name in enumerate(names)}
    ports["gateway_base"] = first + 12  # two gateways; the suite's PostgreSQL is at first + 8
    ports["metrics_base"] = first + 20  # bus + 0, worker + 1, agent i + 10 + i
    root = Path(tempfile.mkdtemp(prefix="gpufleet-faults-"))
    postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="gpufleet-faults-pg-")), first + 8)
    postgres.init()
    postgres.start()
    postgres.create_database("gpufleet")
    data_dir = root / "fleet"
    up = Up(
        data_dir,
        ports,
        {
            "GPUFLEET_UP_STATUS_EVERY_S": "1",
            "GPUFLEET_DATABASE_URL": postgres.url("gpufleet"),
            "GPUFLEET_API_WORKERS": "2",
            "GPUFLEET_CLUSTER_STALE_AFTER_S": "12",
            "GPUFLEET_CLUSTER_DOWN_AFTER_S": "20",
        },
    )
    try:
        up.wait_for(READY, 120)
        yield Fleet(up, postgres, ports)
    finally:
        up.stop()
        postgres.destroy()
        shutil.rmtree(root, ignore_errors=True)
