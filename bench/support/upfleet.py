"""`gpufleet up` for a bench: the whole local fleet (API, PostgreSQL, Celery, NATS, agents,
routers, engine-sim replicas, gateways) on free ports in a data directory of its own, as a
user starts it; stopped with everything it started."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil

from controlplane.local.ports import free_port_block
from controlplane.local.up import postgres_root

READY = "Ctrl-C stops everything."
CLUSTERS = ("euc1-a", "local-a", "use1-a")
"""The demo fleet's clusters; `up` serves cluster i's router on router_base + i."""


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


class UpFleet:
    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        first = free_port_block(40)
        names = ("api", "postgres", "nats", "redis", "router_base")
        self.ports = {name: first + i for i, name in enumerate(names)}
        self.ports |= {"gateway_base": first + 12, "metrics_base": first + 20}
        self.data_dir = root / "fleet"
        run_env = {**os.environ, "GPUFLEET_LOG_LEVEL": "WARNING",
                   "GPUFLEET_CONFIG": str(root / "cli-config.yaml")}  # fmt: skip
        run_env |= {f"GPUFLEET_{k.upper()}_PORT": str(v) for k, v in self.ports.items()}
        for key in ("GPUFLEET_DATABASE_URL", "GPUFLEET_NATS_URL", "GPUFLEET_REDIS_URL"):
            run_env.pop(key, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "up", "--data-dir", str(self.data_dir)],
            env=run_env | (env or {}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.ports['api']}", timeout=30)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout_s: float = 180) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`gpufleet up` exited:\n{self.output[-3000:]}")
            return READY in self.output

        wait_until(ready, timeout_s, "`gpufleet up` to start")
        token = re.search(r"admin token \(shown once, keep it\): (gpf_\S+)", self.output)
        if token is None:
            raise RuntimeError(f"no admin token in `up`'s output:\n{self.output[-3000:]}")
        self.api.headers["Authorization"] = f"Bearer {token[1]}"

    def router(self, cluster: str) -> str:
        return f"http://127.0.0.1:{self.ports['router_base'] + CLUSTERS.index(cluster)}"

    def serving(self, deployment: str, timeout_s: float = 120) -> str:
        """The cluster whose router serves ``deployment`` (waits until one does)."""
        found: list[str] = []

        def check() -> bool:
            for cluster in CLUSTERS:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    models = httpx.get(self.router(cluster) + "/v1/models", timeout=5).json()
                    if deployment in {m["id"] for m in models["data"]}:
                        found[:] = [cluster]
                        return True
            return False

        wait_until(check, timeout_s, f"a plane to serve {deployment}")
        return found[0]

    def replicas(self, cluster: str) -> list[dict]:
        """The replicas the cluster's agent runs (its runtime's record)."""
        record = self.data_dir / "agents" / cluster / "runtime" / "replicas.json"
        with contextlib.suppress(FileNotFoundError, ValueError):
            return json.loads(record.read_text())
        return []

    def stop(self) -> None:
        if self.proc.poll() is None:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            for p in psutil.wait_procs(tree, timeout=10)[1]:
                p.kill()
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if str(self.data_dir) in " ".join(p.info["cmdline"] or []):
                    p.kill()
        self.api.close()


@contextlib.contextmanager
def up_fleet(env: dict[str, str] | None = None) -> Iterator[UpFleet]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-up-"))
    fleet = UpFleet(root, env)
    try:
        fleet.wait_ready()
        yield fleet
    finally:
        fleet.stop()
        shutil.rmtree(postgres_root(fleet.data_dir.resolve()), ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
