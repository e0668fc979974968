"""`gpufleet up` as a user runs it: a subprocess on free ports and its own data directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from controlplane.local.ports import free_port_block
from controlplane.local.up import postgres_root

READY = "Ctrl-C stops everything."


class Up:
    """One `gpufleet up` process; collects its output and the processes it started."""

    started: list[Up] = []  # every Up a test made, for the fixture's teardown

    def __init__(
        self, data_dir: Path, ports: dict[str, int], extra_env: dict[str, str] | None = None
    ) -> None:
        self.cli_config = data_dir.parent / "cli-config.yaml"
        env = {
            **os.environ,
            "GPUFLEET_LOG_LEVEL": "WARNING",
            "GPUFLEET_CONFIG": str(self.cli_config),
        }
        env |= {f"GPUFLEET_{k.upper()}_PORT": str(v) for k, v in ports.items()}
        for key in ("GPUFLEET_DATABASE_URL", "GPUFLEET_NATS_URL", "GPUFLEET_REDIS_URL"):
            env.pop(key, None)
        self.env = env | (extra_env or {})
        self.api = f"http://127.0.0.1:{ports['api']}"
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "up", "--data-dir", str(data_dir)],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        Up.started.append(self)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"`up` never printed {text!r}:\n{self.output}")
            time.sleep(0.1)

    def processes(self) -> list[psutil.Process]:
        """Its process tree plus daemons it started (PostgreSQL) that name the data dir."""
        found = {p.pid: p for p in psutil.Process(self.proc.pid).children(recursive=True)}
        for p in _naming(self.data_dir):
            found[p.pid] = p
        found.pop(self.proc.pid, None)
        return list(found.values())

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)

    def stop(self) -> None:
        """Stop it and everything it started, even when a test failed midway: Ctrl-C, then
        kill what outlives it, and any process that still names the data dir."""
        if self.proc.poll() is None:
            tree = self.processes()
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            for p in psutil.wait_procs(tree, timeout=10)[1]:
                p.kill()
        for p in _naming(self.data_dir):
            p.kill()


@pytest.fixture
def ports() -> dict[str, int]:
    """Below the ephemeral range: `up` binds them seconds after they are chosen, and an
    outgoing connection may be handed a merely-free ephemeral port meanwhile."""
    first = free_port_block(40)  # api, postgres, nats, redis, routers, gateways, metrics (+ 24…)
    names = ("api", "postgres", "nats", "redis", "router_base")
    return {name: first + i for i, name in enumerate(names)} | {"gateway_base": first + 8}


@pytest.fixture
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("up") / "fleet"
    yield path
    for up in Up.started:  # never leave a fleet behind, even when a test fails midway
        up.stop()
    Up.started.clear()
    for p in _naming(path):
        p.kill()
    shutil.rmtree(postgres_root(path.resolve()), ignore_errors=True)


def _wait_until(check, timeout_s: float, what: str) -> None:
    """Bounded polling of something real processes do (placement, NATS, an agent)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def _naming(data_dir: Path) -> list[psutil.Process]:
    """Processes whose command line names the data dir or its PostgreSQL directory."""
    marks = (str(data_dir), str(postgres_root(data_dir.resolve())))
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(m in " ".join(p.info["cmdline"] or []) for m in marks)
    ]


def test_up_serves_the_demo_fleet_stops_cleanly_and_keeps_state(data_dir, ports):
    first = Up(data_dir, ports)
    first.wait_for(READY)
    token = re.search(r"admin token \(shown once, keep it\): (gpf_\S+)", first.output)
    assert token, first.output
    api = httpx.Client(base_url=first.api, headers={"Authorization": f"Bearer {token[1]}"})
    names = {d["name"] for d in api.get("/api/v1/deployments").json()["items"]}
    assert names == {"eu-assistant", "triage-llm", "batch-summarizer"}
    # the "done when": `gpufleet get deployments` in another shell shows them
    assert oct(first.cli_config.stat().st_mode & 0o777) == "0o600"
    shown = subprocess.run([sys.executable, "-m", "controlplane.cli", "get", "deployments"],
                           env=first.env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert all(name in shown.stdout for name in names)
    api.post("/api/v1/gpu-types", json={"name": "B200-192G", "memory_gib": 192}).raise_for_status()

    # the gateways are the main endpoint: said first, each answering, each cluster's
    # endpoint is its router (what the routing table gives the gateways)
    said = first.output.splitlines()
    gateways = [i for i, line in enumerate(said) if line.startswith("  gateway ")]
    routers = [i for i, line in enumerate(said) if line.startswith("  cluster ")]
    assert len(gateways) == 2 and max(gateways) < min(routers), first.output
    for i in range(2):
        health = httpx.get(f"http://127.0.0.1:{ports['gateway_base'] + i}/health", timeout=10)
        assert health.status_code == 200
    use1 = api.get("/api/v1/clusters/use1-a").json()
    assert use1["endpoint"].rstrip("/") == f"http://127.0.0.1:{ports['router_base'] + 2}"

    # the demo fleet serves: placement → desired state → agent → engine-sim replicas → router
    router = OpenAI(base_url=f"http://127.0.0.1:{ports['router_base'] + 2}/v1", api_key="none",
                    timeout=120, max_retries=0)  # use1-a: the third cluster by name  # fmt: skip
    _wait_until(lambda: "triage-llm" in {m.id for m in router.models.list()}, 90,
                "the plane to learn its deployments from the control plane")  # fmt: skip
    answer = router.chat.completions.create(
        model="triage-llm", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert answer.choices[0].message.content
    # …and through a gateway, the main endpoint: routing table from the control plane,
    # the planes' load from their routers, the nearest plane that serves it
    gateway = OpenAI(base_url=f"http://127.0.0.1:{ports['gateway_base']}/v1", api_key="none",
                     timeout=120, max_retries=0)  # fmt: skip
    _wait_until(lambda: "triage-llm" in {m.id for m in gateway.models.list()}, 60,
                "the gateway to learn the routing table")  # fmt: skip
    raw = gateway.chat.completions.with_raw_response.create(
        model="triage-llm", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert raw.headers["x-gpufleet-plane"] == "use1-a"
    assert raw.parse().choices[0].message.content

    second = Up(
        data_dir, {**ports, "api": free_port_block(1)}
    )  # same data dir while the first runs
    assert second.proc.wait(60) == 1
    assert "another `gpufleet up`" in second.output

    started = first.processes()
    assert len(started) >= 6, [p.cmdline() for p in started]
    assert first.interrupt() == 0
    assert psutil.wait_procs(started, timeout=15)[1] == [], "children survived Ctrl-C"
    assert not (data_dir / "up.lock").exists()

    again = Up(data_dir, ports)
    again.wait_for(READY)
    assert "admin token (shown once" not in again.output
    kept = data_dir / "secrets" / "admin-token.json"  # written as soon as it was made
    assert f"admin token: created at the first start (kept in {kept.resolve()})" in again.output
    assert json.loads(kept.read_text()) == {"token": token[1]}
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert api.get("/api/v1/gpu-types/B200-192G").status_code == 200  # state survived
    assert again.interrupt() == 0


def test_a_busy_port_is_a_clear_error(data_dir, ports):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["api"]))
        s.listen()
        up = Up(data_dir, ports)
        assert up.proc.wait(60) == 1
    assert f"api port {ports['api']} already in use" in up.output


def test_a_database_that_cannot_be_reached_is_a_clear_error(data_dir, ports):
    """Not a traceback from deep inside the migrations: what failed and what to change."""
    nowhere = {"GPUFLEET_DATABASE_URL": "postgresql+psycopg://gpufleet:x@127.0.0.1:1/gpufleet"}
    up = Up(data_dir, ports, extra_env=nowhere)
    assert up.proc.wait(120) == 1
    assert "error: cannot use the database:" in up.output
    assert "check GPUFLEET_DATABASE_URL" in up.output and "Traceback" not in up.output
