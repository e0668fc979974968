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
