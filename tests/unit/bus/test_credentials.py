from __future__ import annotations

import stat
import subprocess
from pathlib import Path

from controlplane.bus import (
    cluster_permissions,
    gateway_permissions,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    generate_gateway_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.contracts import FACT_TYPE_NAMES
from controlplane.local.nats import nats_server_binary


def test_cluster_credentials_are_strong_and_unique():
    a1, a2 = generate_cluster_credentials("a"), generate_cluster_credentials("a")
    assert a1.user == a2.user == "cluster-a"
    assert a1.password != a2.password
    assert len(a1.password) >= 43  # 256 bits, base64url
    assert a1.inbox_prefix == "_INBOX_a"
    assert a1.password not in repr(a1)


def test_permissions_name_only_the_clusters_own_subjects():
    perms = cluster_permissions("a")
    assert all(".a" in s or "_a" in s for s in perms.publish + perms.subscribe)
    assert not any(s.endswith(".>") and s.startswith("$JS") for s in perms.publish)
    assert perms.subscribe == ("_INBOX_a.>",)


def test_rendered_config_is_valid_for_nats_server(tmp_path: Path):
    text = render_server_config(
        controlplane=generate_controlplane_credentials(),
        clusters={n: generate_cluster_credentials(n) for n in ("a", "b", "edge-1")},
        store_dir=tmp_path / "js",
        port=4333,
    )
    path = write_server_config(tmp_path / "nats.conf", text)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    check = subprocess.run(
        [nats_server_binary(), "-c", str(path), "-t"], capture_output=True, text=True, timeout=10
    )
    assert check.returncode == 0, check.stderr
    assert "port: 4333" in text
    assert '"cluster-edge-1"' in text
    assert text.count('password: "$2a$10$') == 4  # only bcrypt hashes, never a password


def test_gateway_permissions_are_read_only():
    creds = generate_gateway_credentials("edge-eu")
    assert creds.user == "gateway-edge-eu" and creds.inbox_prefix == "_INBOX_GW_edge-eu"
    perms = gateway_permissions("edge-eu")
    # only the routes key's consumer create and direct get: no report subject, no KV write
    assert all(s.startswith("$JS.API.") and "KV_gpufleet_v1_routes" in s for s in perms.publish)
    assert all(s.endswith("$KV.gpufleet_v1_routes.table") for s in perms.publish)
    assert perms.subscribe == ("gpufleet.v1.cluster.*.load", "_INBOX_GW_edge-eu.>")


def test_no_cluster_name_reaches_a_gateways_inbox():
    """A cluster named `gateway-<g>` subscribed to gateway <g>'s inbox (both
    `_INBOX_gateway-<g>`): it read the routing table's deliveries, and the gateway its
    desired state's."""
    for gateway in ("use1", "edge-eu"):
        inbox = generate_gateway_credentials(gateway).inbox_prefix
        for cluster in (f"gateway-{gateway}", gateway, f"gw-{gateway}"):
            (grant,) = cluster_permissions(cluster).subscribe
            assert not f"{inbox}.x".startswith(grant.removesuffix(">"))


def test_rendered_config_with_gateways_is_valid_for_nats_server(tmp_path: Path):
    gateway = generate_gateway_credentials("edge-1")
    text = render_server_config(
        controlplane=generate_controlplane_credentials(),
        clusters={"a": generate_cluster_credentials("a")},
        gateways={"edge-1": gateway},
        store_dir=tmp_path / "js",
    )
    path = write_server_config(tmp_path / "nats.conf", text)
    check = subprocess.run(
        [nats_server_binary(), "-c", str(path), "-t"], capture_output=True, text=True, timeout=10
    )
    assert check.returncode == 0, check.stderr
    assert '"gateway-edge-1"' in text and gateway.password not in text
    assert text.count('password: "$2a$10$') == 3


def test_a_plane_may_publish_only_the_report_subjects_that_exist():
    """Not its whole prefix: each subject has its own share of the reports stream, and a
    plane inventing fact subjects would have had as many shares as names it made up."""
    reports = [s for s in cluster_permissions("a").publish if s.startswith("gpufleet.")]
    assert sorted(reports) == sorted(
        ["gpufleet.v1.cluster.a.observed", "gpufleet.v1.cluster.a.load"]
        + [f"gpufleet.v1.cluster.a.fact.{t}" for t in FACT_TYPE_NAMES]
    )
    assert "gpufleet.v1.cluster.a.fact.replica_started" in reports
