"""The router's ``GET /internal/load`` (its plane's deployments, traffic and replicas, read by
the plane's agent) answers only clients on the router's own host, wherever the router
listens. Another host is a network namespace joined by a veth link: from there the route is
a 403 in OpenAI's shape, while the public routes answer it as before."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from controlplane.local.ports import wait_for_port
from tests.integration.gateway.netns import PlaneNetwork
from workloadplane.runtime.process import free_port

pytestmark = pytest.mark.integration

FETCH = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""
"""GET argv[1] from wherever it runs: the status, then the body."""


@pytest.fixture
def network() -> Iterator[PlaneNetwork]:
    net = PlaneNetwork().open()
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def router() -> Iterator[int]:
    """A router listening on every address, its one replica never started (no need here)."""
    port = free_port()
    argv = [sys.executable, "-m", "workloadplane.router", "--host", "0.0.0.0",
            "--port", str(port), "--replica", "chat=http://127.0.0.1:9"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, timeout_s=60, alive=lambda: proc.poll() is None)
        yield port
    finally:
        proc.kill()
        proc.wait()


def from_elsewhere(network: PlaneNetwork, url: str) -> tuple[int, str]:
    done = subprocess.run(
        network.argv([sys.executable, "-c", FETCH, url]), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    status, _, body = done.stdout.partition("\n")
    return int(status), body


def test_internal_load_answers_only_the_routers_own_host(network: PlaneNetwork, router: int):
    address = network.links["data"].root_ip  # the router's address on the link
    # on its host: over loopback, and from the address a client elsewhere reaches it on
    for host in ("127.0.0.1", address):
        own = httpx.get(f"http://{host}:{router}/internal/load", timeout=10)
        assert own.status_code == 200, own.text
        assert "chat" in own.json()["deployments"]
    status, body = from_elsewhere(network, f"http://{address}:{router}/internal/load")
    assert status == 403, body
    error = json.loads(body)["error"]
    assert error["code"] == "not_on_this_host" and error["type"] == "permission_error"
    assert "chat" not in body  # nothing of the plane's load leaks in the refusal
    # the public routes still answer that client
    status, body = from_elsewhere(network, f"http://{address}:{router}/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "chat"
