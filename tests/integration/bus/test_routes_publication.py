"""The gateways' routing table on real PostgreSQL and NATS: built from the placement, put in
its bucket by the bus process's `RoutesLoop`, at a generation that moves only when the
table's content does, and re-numbered in a new epoch over an entry the control plane never
issued (issue 15)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import ensure_routes_bucket
from controlplane.bus.routes import current_routes, encode_table
from controlplane.bus_process import RoutesLoop
from controlplane.contracts import ROUTES_KEY, RoutingTable
from controlplane.db import models as m
from controlplane.services import inventory
from controlplane.services.placement import replan
from controlplane.services.resources import KINDS
from tests.integration.bus.conftest import Bus
from tests.integration.placement.test_failover import failover_fleet, load_fleet

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ACTOR = inventory.Actor("test")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _replan(factory: sessionmaker[Session]) -> None:
    with factory() as s, s.begin():
        assert replan(s, "test") is not None


def _patch(factory: sessionmaker[Session], path: str, name: str, body: dict[str, Any]) -> None:
    with factory() as s, s.begin():
        assert inventory.patch(s, KINDS[path], name, body, ACTOR).changed


@pytest.fixture
def placed(tokens, session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    load_fleet(session_factory, failover_fleet())
    _replan(session_factory)
    return session_factory


async def _stored(bus: Bus) -> tuple[RoutingTable, int]:
    table, revision = await current_routes(await ensure_routes_bucket(bus.js))
    assert table is not None, "no routing table in the bucket"
    return table, revision


async def test_the_table_appears_and_moves_only_when_its_content_does(placed, bus: Bus):
    kv = await ensure_routes_bucket(bus.js)
    clock = Clock()
    loop = RoutesLoop(placed, kv, bus.nc.max_payload, full_every_s=30.0, clock=clock)

    await loop.tick()
    table, revision = await _stored(bus)
    assert (table.epoch, table.generation) == (0, 1)
    (chat,) = table.deployments
    assert chat.failover == "active_passive" and chat.jurisdictions == ["US"]
    assert [(p.cluster, p.role, p.replicas) for p in chat.planes] == [
        ("use1-a", "active", 2),
        ("usw2-a", "standby", 1),
    ]
    assert [r.name for r in table.regions] == ["euc1", "use1", "usw2"]

    # nothing changed: no new generation, not even a rewrite — on the next tick, on a full
    # rebuild, and from a restarted bus process
    await loop.tick()
    clock.now += 31
    await loop.tick()
    await RoutesLoop(placed, kv, None, clock=clock).tick()
    assert await _stored(bus) == (table, revision)

    # a cluster's endpoint, a deployment's failover, and its placement: each a new generation
    _patch(placed, "clusters", "use1-a", {"endpoint": "http://10.1.0.1:8200"})
    await loop.tick()
    moved, _ = await _stored(bus)
    assert moved.generation == 2
    assert moved.deployments[0].planes[0].endpoint == "http://10.1.0.1:8200"

    _patch(placed, "deployments", "chat", {"failover": {"hold_down_seconds": 90}})
    await loop.tick()
    moved, _ = await _stored(bus)
    assert (moved.generation, moved.deployments[0].hold_down_seconds) == (3, 90)

    _patch(placed, "deployments", "chat", {"autoscaling": {"min_replicas": 3}})
    _replan(placed)
    await loop.tick()
    moved, _ = await _stored(bus)
    assert moved.generation == 4
    assert [p.replicas for p in moved.deployments[0].planes] == [3, 1]

    # a new region is on the map at once, with no deployment of its own
    with placed() as s, s.begin():
        inventory.create(
            s,
            KINDS["regions"],
            inventory.parse_spec(
                KINDS["regions"],
                {"name": "apne1", "provider": "aws", "code": "ap-northeast-1",
                 "jurisdiction": "JP", "latitude": 35.7, "longitude": 139.7},
            ),
            ACTOR,
        )  # fmt: skip
    await loop.tick()
    moved, _ = await _stored(bus)
    assert moved.generation == 5 and "apne1" in {r.name for r in moved.regions}


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "same-version-other-content"])
async def test_an_entry_never_issued_starts_a_new_epoch(placed, bus: Bus, ahead: bool):
    kv = await ensure_routes_bucket(bus.js)
    clock = Clock()
    loop = RoutesLoop(placed, kv, None, full_every_s=30.0, clock=clock)
    await loop.tick()
    ours, _ = await _stored(bus)
    # no planes: it would blind the gateways (forged, or left by a restored database)
    forged = RoutingTable(generation=10**12 if ahead else ours.generation, epoch=0)
    await kv.put(ROUTES_KEY, encode_table(forged))

    clock.now += 31  # the periodic re-assertion finds it …
    await loop.tick()
    await loop.tick()  # … and the next tick publishes the new epoch
    table, _ = await _stored(bus)
    assert (table.epoch, table.generation) == (1, ours.generation + 1)
    assert table.deployments == ours.deployments
    with placed() as s:
        (event,) = s.scalars(select(m.Event).where(m.Event.type == "RoutesEpochStarted")).all()
    assert event.data["seen"] == {"epoch": 0, "generation": forged.generation}


async def test_a_wiped_bucket_gets_the_same_version_again(placed, bus: Bus):
    kv = await ensure_routes_bucket(bus.js)
    await RoutesLoop(placed, kv, None).tick()
    before, _ = await _stored(bus)
    await bus.js.delete_key_value(kv._name)  # type: ignore[attr-defined]
    kv = await ensure_routes_bucket(bus.js)
    await RoutesLoop(placed, kv, None).tick()  # e.g. the bus process restarted on a new NATS
    after, _ = await _stored(bus)
    assert after.version == before.version  # never back: gateways holding it keep it
    assert after.deployments == before.deployments


async def test_a_plane_serving_from_draining_instances_stays_until_they_stop(placed, bus: Bus):
    """A spot notice moves chat's replicas off cluster use1-b: while its replica on the
    draining instance is still ready (held until its replacement is), use1-b stays listed."""
    with placed() as s, s.begin():
        inventory.create(
            s,
            KINDS["clusters"],
            inventory.parse_spec(
                KINDS["clusters"],
                {"name": "use1-b", "region": "use1", "pools": ["use1-h100"],
                 "endpoint": "http://127.0.0.1:8999"},
            ),
            ACTOR,
        )  # fmt: skip
        ids = {n: i for row in (m.Cluster, m.Pool, m.Deployment)
               for n, i in s.execute(select(row.name, row.id))}  # fmt: skip
        instance = m.Instance(pool_id=ids["use1-h100"], cluster_id=ids["use1-b"], gpus=8,
                              provider_instance_id="i-1", idempotency_key="k-1", state="draining")  # fmt: skip
        s.add(instance)
        s.flush()
        s.add(m.Replica(name="chat-1", deployment_id=ids["chat"], cluster_id=ids["use1-b"],
                        instance_id=instance.id, state="ready"))  # fmt: skip
    kv = await ensure_routes_bucket(bus.js)
    loop = RoutesLoop(placed, kv, None)
    await loop.tick()
    table, _ = await _stored(bus)
    planes = {p.cluster: p.replicas for p in table.deployments[0].planes}
    assert planes == {"use1-a": 2, "use1-b": 1, "usw2-a": 1}

    with placed() as s, s.begin():  # its replacement is ready: the plane drains it
        s.execute(update(m.Replica).where(m.Replica.name == "chat-1").values(state="draining"))
    await loop.tick()
    moved, _ = await _stored(bus)
    assert moved.generation == table.generation + 1
    assert "use1-b" not in {p.cluster for p in moved.deployments[0].planes}
