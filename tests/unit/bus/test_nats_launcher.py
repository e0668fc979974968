from __future__ import annotations

import socket
from pathlib import Path

from controlplane.local.nats import start_nats


def test_start_answers_then_stops_cleanly(tmp_path: Path):
    server = start_nats(tmp_path / "js")
    try:
        with socket.create_connection((server.host, server.port), timeout=1) as sock:
            assert sock.recv(4) == b"INFO"
        assert server.running
    finally:
        server.stop()
    assert not server.running
    assert (tmp_path / "js").is_dir()
    server.stop()  # silent when already stopped
