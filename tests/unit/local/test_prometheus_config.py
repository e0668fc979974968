"""`up`'s Prometheus configuration and file_sd target lists (controlplane/local/prometheus.py)."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.local.prometheus import JOBS, Target, address_of, config, file_sd, write


def test_each_job_reads_its_own_target_file(tmp_path: Path) -> None:
    text = config(tmp_path)
    for job in JOBS:
        assert f"job_name: gpufleet-{job}" in text
        assert str(tmp_path / "targets" / f"{job}.json") in text


def test_targets_are_file_sd_groups_with_their_labels_in_a_stable_order() -> None:
    groups = json.loads(
        file_sd(
            [
                Target("127.0.0.1:8102", {"cluster": "use1-a"}),
                Target("127.0.0.1:8100", {"cluster": "euc1-a"}),
            ]
        )
    )
    assert groups == [
        {"targets": ["127.0.0.1:8100"], "labels": {"cluster": "euc1-a"}},
        {"targets": ["127.0.0.1:8102"], "labels": {"cluster": "use1-a"}},
    ]
    assert address_of("http://10.0.0.5:8000/v1") == "10.0.0.5:8000"


def test_only_changed_lists_are_rewritten_and_a_missing_job_is_empty(tmp_path: Path) -> None:
    api = {"api": [Target("127.0.0.1:8080", {})]}
    assert write(tmp_path, api) == list(JOBS)  # first write: every file
    assert write(tmp_path, api) == []  # nothing changed: Prometheus sees no event
    routers = api | {"router": [Target("127.0.0.1:8100", {"cluster": "a"})]}
    assert write(tmp_path, routers) == ["router"]
    assert json.loads((tmp_path / "targets" / "bus.json").read_text()) == []
    assert write(tmp_path, api) == ["router"]  # the cluster went: its target goes
    assert json.loads((tmp_path / "targets" / "router.json").read_text()) == []


def test_up_gives_the_portless_processes_metrics_ports_and_lists_every_job() -> None:
    from controlplane.local.gateways import metrics_ports
    from controlplane.local.up import ScrapeTargets
    from controlplane.services.fleet_view import ReplicaEndpoint
    from controlplane.settings import Settings

    default = metrics_ports(Settings(router_base_port=9100))
    assert default is not None
    assert (default.bus, default.worker, default.agent(2)) == (9120, 9121, 9132)
    assert metrics_ports(Settings(metrics_base_port=0)) is None
    chosen = metrics_ports(Settings(metrics_base_port=7000))
    assert chosen is not None and chosen.agent(0) == 7010

    targets = ScrapeTargets.__new__(ScrapeTargets)
    targets.settings, targets.clusters = Settings(router_base_port=9100), ["a", "b"]
    replica = ReplicaEndpoint("a", "chat", "chat-1", "http://127.0.0.1:41000/v1")
    jobs = targets.jobs({"a": "http://127.0.0.1:9100"}, [replica])
    assert set(jobs) == set(JOBS)
    assert [t.address for t in jobs["worker"]] == ["127.0.0.1:9121"]
    assert [(t.address, t.labels["cluster"]) for t in jobs["agent"]] == [
        ("127.0.0.1:9130", "a"),
        ("127.0.0.1:9131", "b"),
    ]
    [only] = jobs["replica"]
    assert only.address == "127.0.0.1:41000"
    assert dict(only.labels) == {"cluster": "a", "deployment": "chat", "replica": "chat-1"}
    off = ScrapeTargets.__new__(ScrapeTargets)
    off.settings, off.clusters = Settings(metrics_base_port=0), ["a"]
    assert "worker" not in off.jobs({})
