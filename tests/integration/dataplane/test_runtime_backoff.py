"""The runtime's replica-restart backoff (issue 12 item 5): it doubles while a deployment's
replicas keep failing and starts over once one of them has been healthy for
``stable_after_s``, so a failure after a healthy period is not punished for old ones."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.integration.dataplane.conftest import make_sim_deployment
from tests.integration.dataplane.test_router_enginesim import until
from workloadplane.runtime.process import ProcessConfig, ProcessRuntime
from workloadplane.runtime.templates import enginesim_template

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class Clock:
    """What the runtime reads as time for its decisions (health sleeps stay real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_restart_backoff_resets_after_a_healthy_period(tmp_path: Path):
    clock = Clock()
    config = ProcessConfig(health_interval_s=0.2, backoff_initial_s=0.2, stable_after_s=60)
    runtime = ProcessRuntime(enginesim_template(), tmp_path, config=config, clock=clock)
    spec = make_sim_deployment().spec
    try:

        async def ready_then_killed() -> None:
            replica = await runtime.start("chat", spec)
            rid = replica.replica_id
            await until(lambda: runtime.state(rid) == "ready", "the replica to be ready", 30)
            pid = runtime.pid(rid)
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)
            await until(lambda: runtime.state(rid) == "failed", "the failure to be seen", 10)
            await runtime.stop(rid)

        await ready_then_killed()
        await ready_then_killed()
        assert runtime.backoff_s("chat") == pytest.approx(0.4)  # 0.2, then doubled
        replica = await runtime.start("chat", spec)
        rid = replica.replica_id
        await until(lambda: runtime.state(rid) == "ready", "the replacement to be ready", 30)
        clock.now += 61  # healthy for longer than stable_after_s
        await until(lambda: runtime.backoff_s("chat") == 0.0, "the backoff to start over", 5)
    finally:
        await runtime.close()
