"""`gpufleet router --api-keys-file`: the plane's router as its own process, keys from the
file (a raw key and one given by its digest): without one, inference and /v1/models are
refused; the key is never written to the log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from workloadplane.router.keys import hash_key
from workloadplane.runtime.process import free_port

pytestmark = pytest.mark.integration

KEY, OTHER = "sk-plane-0123456789", "sk-gateway-9876543210"


def test_a_router_started_with_a_keys_file_serves_only_its_keys(tmp_path: Path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({KEY: {"tier": 0}, f"sha256:{hash_key(OTHER)}": {"tier": 2}}))
    port, log = free_port(), tmp_path / "router.log"
    argv = [sys.executable, "-m", "workloadplane.router", "--replica", "chat=http://127.0.0.1:9",
            "--port", str(port), "--api-keys-file", str(keys)]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=5) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the router did not start"
                time.sleep(0.05)  # a real process starting: nothing to inject a clock into
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            for r in (
                client.post("/v1/chat/completions", json=body),
                client.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": "Bearer x"}
                ),
                client.get("/v1/models"),
            ):
                assert r.status_code == 401, r.text
                assert r.json()["error"]["code"] == "invalid_api_key"
            for key in (KEY, OTHER):
                listed = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
                assert listed.status_code == 200
                assert [m["id"] for m in listed.json()["data"]] == ["chat"]
    finally:
        proc.terminate()
        proc.wait(10)
    assert KEY not in log.read_text() and OTHER not in log.read_text()
