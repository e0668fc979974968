"""Two bus processes share the reports consumer: two heartbeats of one plane can be recorded
at once. Both passed the "older than the last one recorded?" check before either committed,
so the older one could commit last and stand. The cluster row is now locked before the
check: the one that waits sees the other's heartbeat."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text, update

from controlplane.contracts import ObservedState
from controlplane.db import models as m
from controlplane.services.observed import DbSink
from tests.integration.bus.conftest import eventually
from tests.integration.planes.test_capacity import cluster, fleet  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


def _waiting_on_locks(session_factory) -> int:
    with session_factory() as s:
        return s.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        )


@pytest.mark.usefixtures("fleet")
async def test_the_older_of_two_heartbeats_recorded_at_once_never_stands(session_factory):
    with session_factory() as s, s.begin():
        s.execute(update(m.Cluster).values(state="healthy"))
    one, two = DbSink(session_factory), DbSink(session_factory)
    t1 = datetime.now(UTC)
    t2 = t1 + timedelta(seconds=5)

    def beat() -> ObservedState:
        return ObservedState(cluster="cheap", source="cluster/cheap")

    with session_factory() as holder, holder.begin():  # the row is busy (a re-plan, say)
        holder.execute(
            select(m.Cluster).where(m.Cluster.name == "cheap").with_for_update(of=m.Cluster)
        )
        newer = asyncio.create_task(two.record_observed("cheap", beat(), t2))
        await eventually(lambda: _waiting_on_locks(session_factory) >= 1, 10, "newer waits")
        older = asyncio.create_task(one.record_observed("cheap", beat(), t1))
        await eventually(lambda: _waiting_on_locks(session_factory) >= 2, 10, "older waits")
    await asyncio.gather(newer, older)
    assert cluster(session_factory, "cheap").last_heartbeat_at == t2
