from __future__ import annotations

import stat
import subprocess
from pathlib import Path

from controlplane.bus import (
    cluster_permissions,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
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
