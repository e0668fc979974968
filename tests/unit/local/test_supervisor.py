"""`up`'s supervision: a child's whole process group is stopped, the backoff starts over after
a healthy run, a failing periodic job never ends `up`. Real processes, no services."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from controlplane.local.supervisor import HEALTHY_AFTER_S, Child, _group_alive
from controlplane.local.up import Periodic

# a leader that forks a worker into its own process group, like a uvicorn master
LEADER = [
    sys.executable,
    "-c",
    "import os, subprocess, sys, time\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "open(sys.argv[1], 'w').write(str(w.pid)); time.sleep(60)",
]


def _start_leader(tmp_path: Path) -> tuple[Child, int]:
    pid_file = tmp_path / "worker.pid"
    child = Child("api", [*LEADER, str(pid_file)])
    child.start(dict(os.environ), tmp_path, now=0.0)
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    return child, int(pid_file.read_text())


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait long for its reaper here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_leader_takes_the_workers_it_left_with_it(tmp_path):
    child, worker = _start_leader(tmp_path)
    assert child.process is not None
    pgid = child.process.pid
    os.kill(pgid, signal.SIGKILL)  # the master dies; its worker would go on serving
    child.process.wait(10)
    assert child.exited and _group_alive(pgid)
    note = child.reap(now=5.0)
    assert note == "api exited (-9); restarting in 1 s"
    assert not _group_alive(pgid)
    assert not _running(worker), "the dead master's worker is still running"
    assert child.next_start == 6.0


def test_stop_stops_the_whole_group(tmp_path):
    child, worker = _start_leader(tmp_path)
    assert child.process is not None
    pgid = child.process.pid
    child.stop(timeout_s=5)
    assert not _group_alive(pgid)
    assert not _running(worker)


def test_the_backoff_doubles_while_a_child_keeps_dying_and_resets_after_a_healthy_run(tmp_path):
    child = Child("nats", [sys.executable, "-c", "raise SystemExit(3)"])
    now = 0.0
    delays = []
    for _ in range(4):  # dies right after each start
        child.start(dict(os.environ), tmp_path, now)
        assert child.process is not None
        child.process.wait(10)
        child.reap(now)
        delays.append(child.next_start - now)
        now = child.next_start
    assert delays == [1.0, 2.0, 4.0, 8.0]
    child.start(dict(os.environ), tmp_path, now)  # this time it runs a healthy while
    assert child.process is not None
    child.process.wait(10)
    child.reap(now + HEALTHY_AFTER_S)
    assert child.next_start - (now + HEALTHY_AFTER_S) == 1.0


def test_a_failing_job_is_said_once_and_its_recovery_too():
    down = True

    def refresh() -> str | None:
        if down:
            raise ConnectionRefusedError("connection to 127.0.0.1:5433 refused")
        return None

    job = Periodic("refreshing the NATS users from the database", refresh, every_s=1.0)
    assert job.run(0.0) == (
        "refreshing the NATS users from the database failed (ConnectionRefusedError: "
        "connection to 127.0.0.1:5433 refused); retrying every 1 s"
    )
    assert not job.due(0.5) and job.due(1.0)
    assert job.run(1.0) is None  # still down: nothing new to say
    down = False
    assert job.run(2.0) == "refreshing the NATS users from the database works again"
    assert job.run(3.0) is None


def test_waiting_for_a_port_ends_at_once_when_its_server_exits():
    from controlplane.local.ports import ServerExited, free_port, wait_for_port

    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ServerExited, match=f"127.0.0.1:{port} exited before it answered"):
        wait_for_port(port, timeout_s=60, alive=lambda: False)
    assert time.monotonic() - started < 5  # not the 60 s
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        wait_for_port(server.getsockname()[1], timeout_s=5, alive=lambda: False)  # it answers


def test_a_workload_plane_process_gets_none_of_the_control_planes_credentials(tmp_path):
    """`up` hands its children the control plane's NATS user (it may write every plane's
    desired state) and the database: an agent, router or gateway has its own NATS user's
    file and must not hold them (an engine under an agent runs model code)."""
    base = {
        **os.environ,
        "GPUFLEET_NATS_USER": "controlplane",
        "GPUFLEET_NATS_PASSWORD": "cp-secret",
        "GPUFLEET_DATABASE_URL": "postgresql://gpufleet:cp-secret@127.0.0.1/gpufleet",
        "GPUFLEET_REDIS_URL": "redis://127.0.0.1:1/0",
        "GPUFLEET_NATS_URL": "nats://127.0.0.1:4222",
        # the operator's cloud keys and a provider's `credentials_ref: env:` JSON
        "AWS_SECRET_ACCESS_KEY": "k",
        "GOOGLE_APPLICATION_CREDENTIALS": "/x.json",
        "AWS_MAIN_CREDS": '{"aws_secret_access_key": "k"}',
        "GPUFLEET_EVENTS_WEBHOOK_TOKEN": "t",
        "HF_TOKEN": "hf",
    }
    dump = [sys.executable, "-c", "import os, sys; sys.stdout.write(repr(sorted(os.environ)))"]
    seen = {}
    for name, plane in (("agent-use1", True), ("api", False)):
        child = Child(name, dump, plane=plane)
        child.start(base, tmp_path, now=0.0)
        assert child.process is not None and child.process.wait(30) == 0
        seen[name] = (tmp_path / f"{name}.log").read_text()
    for secret in ("GPUFLEET_NATS_PASSWORD", "GPUFLEET_DATABASE_URL", "GPUFLEET_REDIS_URL",
                   "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_MAIN_CREDS",
                   "GPUFLEET_EVENTS_WEBHOOK_TOKEN"):  # fmt: skip
        assert f"'{secret}'" not in seen["agent-use1"] and f"'{secret}'" in seen["api"]
    assert "GPUFLEET_NATS_URL" in seen["agent-use1"]  # where NATS is stays
    assert "'HF_TOKEN'" in seen["agent-use1"]  # engines load models with it


def test_up_starts_agents_routers_and_gateways_as_workload_plane_processes(tmp_path):
    from controlplane.local.gateways import GATEWAYS
    from controlplane.local.up import processes
    from controlplane.settings import Settings

    settings = Settings(data_dir=tmp_path)
    children = processes(
        settings, {"use1-a": tmp_path / "a.creds"}, [(GATEWAYS[0], tmp_path / "g.creds")]
    )
    planes = sorted(c.name for c in children if c.plane)
    assert planes == ["agent-use1-a", "gateway-use1", "router-use1-a"]
    assert {"api", "worker", "beat", "bus"} <= {c.name for c in children if not c.plane}
