"""Faults injected into a running `gpufleet up` (issue 12, items 3, 9 and 12): one dependency
frozen, killed or gone never takes the fleet down, and `up` brings it back.

One fleet for the module (starting one costs ~30 s), its PostgreSQL owned by the test so that
an outage can be made and ended at will; `up` ticks every second instead of every 15 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import psycopg

from tests.integration.faults.conftest import Fleet
from tests.integration.test_up import _wait_until


def test_killed_nats_is_restarted_and_leaves_no_zombie(fleet: Fleet) -> None:
    nats = fleet.child("nats-server")
    nats.send_signal(signal.SIGKILL)
    fleet.says("nats exited (-9); restarting in 1 s")
    fleet.says("nats restarted")
    assert not psutil.pid_exists(nats.pid) or nats.status() != psutil.STATUS_ZOMBIE
    _wait_until(lambda: "nats✓" in fleet.up.lines[-1], 30, "the status line to show nats up")
    assert fleet.router_serves()
    assert fleet.up.proc.poll() is None


def test_a_killed_api_master_takes_its_workers_along_and_comes_back(fleet: Fleet) -> None:
    master = fleet.child("controlplane.api.main:build_app")
    workers = master.children(recursive=True)
    assert workers, "the API runs uvicorn workers"
    master.send_signal(signal.SIGKILL)
    fleet.says("api exited (-9)")
    assert psutil.wait_procs(workers, timeout=10)[1] == [], "orphaned API workers still serve"
    fleet.says("api restarted", 60)
    _wait_until(lambda: _answers(fleet.api, "/api/v1/deployments"), 60, "the API to answer")
    log = (fleet.up.data_dir / "logs" / "api.log").read_text()
    assert "address already in use" not in log.lower()


def test_a_frozen_api_is_named_by_the_cli(fleet: Fleet) -> None:
    master = fleet.child("controlplane.api.main:build_app")
    os.killpg(master.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        shown = subprocess.run(
            [sys.executable, "-m", "controlplane.cli", "get", "deployments"],
            env={**fleet.up.env, "GPUFLEET_CLI_TIMEOUT": "2"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        waited = time.monotonic() - started
    finally:
        os.killpg(master.pid, signal.SIGCONT)
    assert shown.returncode == 1
    assert f"the API at {fleet.up.api} did not answer in 2 s" in shown.stderr + shown.stdout
    assert waited < 15


def test_a_database_outage_never_takes_the_fleet_down(fleet: Fleet) -> None:
    fleet.postgres.stop()
    try:
        fleet.says("refreshing the NATS users from the database failed (OperationalError")
        failing = fleet.api.get("/api/v1/deployments")
        assert failing.status_code == 503
        assert failing.headers["content-type"] == "application/problem+json"
        assert failing.headers["retry-after"] == "5"
        assert "database is not answering; retry in a few seconds" in failing.json()["detail"]
        ready = httpx.get(f"{fleet.up.api}/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["status"] == "database unreachable"
        # the driver's error, named: OperationalError (refused) or one of its kinds, e.g.
        # AdminShutdown when a pooled connection was open as PostgreSQL stopped
        reason = ready.json()["reason"]
        named = getattr(psycopg.errors, reason, None)
        assert isinstance(named, type) and issubclass(named, psycopg.OperationalError), reason
        assert "127.0.0.1" not in ready.text and "port" not in ready.text  # no token needed
        # more status ticks go by with the database gone: `up` and the planes carry on
        marks = len(fleet.up.lines)
        _wait_until(lambda: len(fleet.up.lines) >= marks + 3, 30, "three more status ticks")
        assert fleet.up.proc.poll() is None, fleet.up.output
        assert fleet.router_serves()
    finally:
        fleet.postgres.start()
    fleet.says("refreshing the NATS users from the database works again")
    _wait_until(lambda: _answers(fleet.api, "/api/v1/deployments"), 30, "the API to recover")
    assert httpx.get(f"{fleet.up.api}/readyz", timeout=10).status_code == 200


def _answers(api: httpx.Client, path: str) -> bool:
    try:
        return api.get(path).status_code == 200
    except httpx.HTTPError:
        return False
