"""The control plane's publisher takes the one-round-trip path only when it is safe."""

from __future__ import annotations

import pytest

from controlplane.bus.desired import DesiredPublisher, current_desired, publish_desired
from tests.integration.bus.builders import make_desired

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_a_newer_snapshot_written_by_someone_else_is_never_overwritten(bus):
    publisher = DesiredPublisher(bus.kv)
    assert (await publisher.publish(make_desired("a", 1))).outcome == "published"
    assert (await publisher.publish(make_desired("a", 2))).outcome == "published"

    await publish_desired(bus.kv, make_desired("a", 5))  # another control plane, newer
    stale = await publisher.publish(make_desired("a", 3))
    assert stale.outcome == "stale"
    assert stale.stored_generation == 5
    stored, _ = await current_desired(bus.kv, "a")
    assert stored is not None
    assert stored.generation == 5

    assert (await publisher.publish(make_desired("a", 6))).outcome == "published"
    stored, _ = await current_desired(bus.kv, "a")
    assert stored is not None
    assert stored.generation == 6
