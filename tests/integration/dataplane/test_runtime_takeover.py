"""The process runtime across an agent restart and against what it is handed: real
engine-sim processes, a second ``ProcessRuntime`` taking over the first one's replicas."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from tests.integration.dataplane.conftest import make_sim_deployment
from tests.integration.dataplane.test_router_enginesim import until
from workloadplane.runtime.process import ProcessConfig, ProcessRuntime
from workloadplane.runtime.templates import enginesim_template

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CONFIG = ProcessConfig(health_interval_s=0.1, health_timeout_s=0.3, unhealthy_after=3)


async def test_a_hung_replica_taken_over_as_ready_fails_within_its_health_checks(
    tmp_path: Path,
):
    """Taken over "ready", it used to wait out the 600 s startup timeout before anything
    looked at it: counted as capacity, nothing replaced it."""
    first = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    started = await first.start("chat", make_sim_deployment().spec)
    rid = started.replica_id
    await until(lambda: first.state(rid) == "ready", "the replica to be ready", 30)
    pid = first.pid(rid)
    assert pid is not None
    await first.close(stop_replicas=False)  # the agent restarts; its replica runs on
    os.killpg(pid, signal.SIGSTOP)
    second = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    try:
        assert [r.state for r in await second.list_replicas()] == ["ready"]
        await until(lambda: second.state(rid) == "failed", "the hung replica to fail", 5)
    finally:
        with contextlib.suppress(ProcessLookupError):  # failed: it was killed
            os.killpg(pid, signal.SIGCONT)
        await second.close()


async def test_a_bad_record_does_not_keep_the_other_replicas_from_being_taken_over(
    tmp_path: Path,
):
    first = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    started = await first.start("chat", make_sim_deployment().spec)
    await until(lambda: first.state(started.replica_id) == "ready", "ready", 30)
    await first.close(stop_replicas=False)
    record = tmp_path / "replicas.json"
    rows = json.loads(record.read_text())
    forged = {**rows[0], "replica_id": "x" * 200, "spec": {"model_id": "m"}}
    record.write_text(json.dumps([forged, *rows]))
    second = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    try:
        listed = await second.list_replicas()
        assert [r.replica_id for r in listed] == [started.replica_id]
    finally:
        await second.close()


async def test_a_replica_that_could_not_be_listed_is_not_started(tmp_path: Path):
    """Its id (name, revision, pid, count) over the 128 a status holds: recorded anyway, it
    made every later listing fail, and with it every reconcile pass and heartbeat."""
    runtime = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    try:
        with pytest.raises(ValueError, match="replica_id"):
            await runtime.start("x" * 130, make_sim_deployment().spec)
        assert await runtime.list_replicas() == []
        assert runtime.gpus.free == runtime.gpus.total
    finally:
        await runtime.close()


async def test_an_engine_does_not_get_the_agents_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An engine runs model code: the NATS and database credentials the agent (or `gpufleet
    up`'s supervisor) holds in its environment stay there."""
    monkeypatch.setenv("GPUFLEET_NATS_PASSWORD", "agent-secret")
    monkeypatch.setenv("GPUFLEET_DATABASE_URL", "postgresql://u:agent-secret@db/x")
    monkeypatch.setenv("SOME_PASSWORD", "agent-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_for_the_engine")
    runtime = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    try:
        started = await runtime.start("chat", make_sim_deployment().spec)
        await until(lambda: runtime.pid(started.replica_id) is not None, "launched", 30)
        environ = Path(f"/proc/{runtime.pid(started.replica_id)}/environ").read_bytes()
        assert b"agent-secret" not in environ
        assert b"HF_TOKEN=hf_for_the_engine" in environ
        assert b"GPUFLEET_VIRTUAL_GPUS=" in environ  # what the runtime gives it still
    finally:
        await runtime.close()


async def test_a_pid_that_is_another_process_now_is_never_taken_over(tmp_path: Path):
    """After a reboot (or in a new pid namespace) a recorded pid may be another process:
    it was taken over as the replica, failed its health checks and had its process group
    killed. A recorded replica whose process identity differs is left alone."""
    import subprocess
    import sys

    first = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    started = await first.start("chat", make_sim_deployment().spec)
    await until(lambda: first.state(started.replica_id) == "ready", "ready", 30)
    await first.stop(started.replica_id)
    await first.close()
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        record = tmp_path / "replicas.json"
        row = {
            "replica_id": started.replica_id, "deployment": "chat",
            "spec": make_sim_deployment().spec.model_dump(), "port": 1, "gpus": [],
            "pid": bystander.pid, "identity": "another-boot:1", "state": "ready",
            "started_at": "2026-12-07T00:00:00+00:00",
        }  # fmt: skip
        record.write_text(json.dumps([row]))
        second = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
        try:
            assert await second.list_replicas() == []
        finally:
            await second.close()
        assert bystander.poll() is None  # never signalled
    finally:
        bystander.kill()
        bystander.wait()


async def test_a_state_dir_that_cannot_be_written_does_not_wedge_the_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A full disk made recording the replica's "ready" raise: the healthy engine was
    killed as failed, and every later stop re-raised, so its GPUs were never released."""
    runtime = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)
    real = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "replicas.tmp":
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    try:
        started = await runtime.start("chat", make_sim_deployment().spec)
        monkeypatch.setattr(Path, "write_text", full)
        await until(lambda: runtime.state(started.replica_id) == "ready", "ready", 30)
        await runtime.stop(started.replica_id)
        assert runtime.state(started.replica_id) is None
        assert runtime.gpus.free == runtime.gpus.total
        monkeypatch.undo()
        again = await runtime.start("chat", make_sim_deployment().spec)  # disk back
        rows = json.loads((tmp_path / "replicas.json").read_text())
        assert [r["replica_id"] for r in rows] == [again.replica_id]
    finally:
        await runtime.close()


async def test_gpus_are_given_back_when_a_start_fails_after_taking_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A port that could not be had (EMFILE) leaked the GPUs taken just before, one
    allocation a retry, until none were left."""
    runtime = ProcessRuntime(enginesim_template(), tmp_path, config=CONFIG)

    def no_port(host: str) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("workloadplane.runtime.process.free_port", no_port)
    try:
        for _ in range(3):
            with pytest.raises(OSError, match="Too many open files"):
                await runtime.start("chat", make_sim_deployment().spec)
        assert runtime.gpus.free == runtime.gpus.total
    finally:
        await runtime.close()
