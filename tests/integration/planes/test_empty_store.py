"""The NATS server comes back on an empty store (a new node, a lost volume): the bus process
found every publication and its consumer failing until it was restarted by hand — no desired
state reached a plane and no heartbeat was recorded. It now makes the streams and its
consumer again and publishes everything again; the agent, which kept serving, picks up."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from controlplane.db import models as m
from controlplane.services.placement import replan
from tests.integration.bus.conftest import eventually
from tests.integration.planes.conftest import bus_and_agent
from tests.integration.planes.test_control_loop import _cluster


async def test_the_bus_makes_its_streams_again_when_nats_comes_back_empty(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    async with bus_and_agent(fleet, session_factory, database_url, tmp_path, monkeypatch,
                             bus_progress_every_s=0.2) as planes:  # fmt: skip
        await eventually(lambda: _cluster(session_factory).state == "healthy", 15, "a heartbeat")
        with session_factory() as s, s.begin():
            assert replan(s, "test") is not None
        first = _cluster(session_factory).desired_generation
        await eventually(lambda: _cluster(session_factory).observed_generation >= first, 15,
                         "the agent to apply the placement")  # fmt: skip

        planes.server.stop()
        shutil.rmtree(planes.store)  # every stream, bucket and consumer gone
        planes.server.start()
        restarted = datetime.now(UTC)

        # heartbeats are recorded again (the reports stream and its consumer made again)
        await eventually(lambda: (_cluster(session_factory).last_heartbeat_at or restarted)
                         > restarted, 30, "a heartbeat recorded after the restart")  # fmt: skip
        # and a new placement reaches the agent (the desired-state bucket made again)
        with session_factory() as s, s.begin():
            s.scalars(select(m.Cluster)).one().desired_generation += 1
        second = _cluster(session_factory).desired_generation
        await eventually(lambda: _cluster(session_factory).observed_generation >= second, 30,
                         "the agent to apply a generation published after the restart")  # fmt: skip
