"""Issue 12 item 11 on the bus side: a snapshot bigger than the NATS server's max_payload is
not sent, says so once, and never stops the other clusters; a deleted cluster's agent is
told to stop. Real NATS (a small `max_payload` in its config) and the real database; many
deployments within the API's limits on one cluster make its snapshot too large."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import (
    ensure_bus,
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.bus.desired import TOO_LARGE, current_desired
from controlplane.bus_process import SnapshotLoop
from controlplane.db import models as m
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from controlplane.services import inventory
from controlplane.services.resources import KINDS
from controlplane.specs import (
    ClusterSpec,
    DeploymentSpec,
    GpuTypeSpec,
    PoolSpec,
    ProviderSpec,
    RegionSpec,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MAX_PAYLOAD = 32 * 1024
ACTOR = inventory.Actor("test")
ARGS = [f"--arg-{i:02d}={'x' * 60}" for i in range(32)]  # ~2.3 KB: well within the API's limits


@pytest.fixture
async def small_nats(tmp_path: Path) -> AsyncIterator[tuple[Client, KeyValue]]:
    cp = generate_controlplane_credentials()
    port, store = free_port(), tmp_path / "jetstream"
    text = render_server_config(controlplane=cp, clusters={}, store_dir=store, port=port)
    conf = write_server_config(tmp_path / "nats.conf", text + f"max_payload: {MAX_PAYLOAD}\n")
    server = NatsServer(store_dir=store, port=port, config_file=conf, log_file=tmp_path / "log")
    server.start()
    try:
        nc = await nats.connect(server.url, **cp.connect_options())
        kv = await ensure_bus(nc.jetstream(timeout=2.0))
        yield nc, kv
        await nc.close()
    finally:
        server.stop()


def _create(session: Session, path: str, spec: object) -> None:
    inventory.create(session, KINDS[path], spec, ACTOR)  # type: ignore[arg-type]


def _place(session: Session, deployment: str, cluster: str) -> None:
    """What a re-plan writes: one replica of `deployment` on `cluster`, its generation bumped."""
    ids = {
        name: row_id
        for row_type in (m.Deployment, m.Cluster, m.Pool)
        for name, row_id in session.execute(select(row_type.name, row_type.id))
    }
    session.add(
        m.Placement(
            deployment_id=ids[deployment],
            cluster_id=ids[cluster],
            pool_id=ids["p1"],
            replicas=1,
            max_replicas=1,
        )
    )
    session.execute(
        update(m.Cluster)
        .where(m.Cluster.name == cluster)
        .values(desired_generation=m.Cluster.desired_generation + 1)
    )


def _deployment(name: str, args: list[str]) -> DeploymentSpec:
    return DeploymentSpec(
        name=name, model_id="m/x", gpus_per_replica=1, gpu_types=["H100-80G"], engine_args=args
    )


@pytest.fixture
def fleet(tokens, session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    """Clusters `big` (20 deployments with long engine args) and `small` (one)."""
    with session_factory() as s, s.begin():
        _create(
            s,
            "providers",
            ProviderSpec.model_validate(
                {"name": "aws", "provider_kind": "aws", "provider_class": "hyperscaler"}
            ),
        )
        _create(
            s,
            "regions",
            RegionSpec(
                name="use1",
                provider="aws",
                code="us-east-1",
                jurisdiction="US",
                latitude=38.9,
                longitude=-77.4,
            ),
        )
        _create(s, "gpu-types", GpuTypeSpec(name="H100-80G", memory_gib=80))
        _create(
            s,
            "pools",
            PoolSpec.model_validate(
                {
                    "name": "p1",
                    "provider": "aws",
                    "region": "use1",
                    "gpu_type": "H100-80G",
                    "purchase_type": "on_demand",
                    "gpus": 64,
                    "price_per_gpu_hour": "3",
                    "quota_gpus": 64,
                }
            ),
        )
        for cluster in ("big", "small"):
            _create(s, "clusters", ClusterSpec(name=cluster, region="use1", pools=["p1"]))
        for i in range(20):
            _create(s, "deployments", _deployment(f"wide-{i:02d}", ARGS))
            _place(s, f"wide-{i:02d}", "big")
        _create(s, "deployments", _deployment("chat", []))
        _place(s, "chat", "small")
    return session_factory


def _events(factory: sessionmaker[Session], kind: str) -> list[m.Event]:
    with factory() as s:
        return list(s.scalars(select(m.Event).where(m.Event.type == kind).order_by(m.Event.time)))


def _generation(factory: sessionmaker[Session], cluster: str) -> int:
    with factory() as s:
        return s.scalars(
            select(m.Cluster.desired_generation).where(m.Cluster.name == cluster)
        ).one()


async def _stored(kv: KeyValue, cluster: str) -> tuple[int, set[str]] | None:
    state, _ = await current_desired(kv, cluster)
    return None if state is None else (state.generation, {d.name for d in state.deployments})


async def test_an_oversized_snapshot_is_held_back_and_the_rest_keeps_flowing(fleet, small_nats):
    nc, kv = small_nats
    assert nc.max_payload == MAX_PAYLOAD  # read from the server's INFO
    loop = SnapshotLoop(fleet, kv, nc.max_payload)
    before = TOO_LARGE.labels(cluster="big")._value.get()

    await loop.tick()
    assert await _stored(kv, "big") is None
    assert await _stored(kv, "small") == (_generation(fleet, "small"), {"chat"})
    [event] = _events(fleet, "DesiredStateTooLarge")
    assert event.object_name == "big"
    assert event.data["size_bytes"] > MAX_PAYLOAD
    assert event.data["limit_bytes"] == MAX_PAYLOAD
    assert len(event.data["biggest"]) == 3
    assert str(MAX_PAYLOAD) in event.message and "wide-" in event.message
    assert TOO_LARGE.labels(cluster="big")._value.get() == before + 1

    with fleet() as s, s.begin():  # both clusters change; big is still too large
        _create(s, "deployments", _deployment("chat-2", []))
        _place(s, "chat-2", "small")
        _create(s, "deployments", _deployment("wide-20", ARGS))
        _place(s, "wide-20", "big")
    await loop.tick()
    assert await _stored(kv, "small") == (_generation(fleet, "small"), {"chat", "chat-2"})
    assert await _stored(kv, "big") is None
    assert len(_events(fleet, "DesiredStateTooLarge")) == 1  # once per episode
    assert nc.is_connected

    with fleet() as s, s.begin():  # the user deletes most of them: each delete bumps big
        for i in range(4, 21):
            inventory.delete(s, KINDS["deployments"], f"wide-{i:02d}", ACTOR)
    await loop.tick()
    stored = await _stored(kv, "big")
    assert stored == (_generation(fleet, "big"), {f"wide-{i:02d}" for i in range(4)})
    [sent] = _events(fleet, "DesiredStateSent")
    assert sent.object_name == "big"


async def test_a_deleted_clusters_agent_is_told_to_stop_and_its_name_can_be_used_again(
    fleet, small_nats
):
    nc, kv = small_nats
    loop = SnapshotLoop(fleet, kv, nc.max_payload)
    await loop.tick()
    generation, running = await _stored(kv, "small") or (0, set())
    assert running == {"chat"}

    with fleet() as s, s.begin():
        inventory.delete(s, KINDS["clusters"], "small", ACTOR)
    await loop.tick()
    retired, _ = await current_desired(kv, "small")
    assert retired is not None
    assert retired.generation == generation + 1
    assert retired.deployments == [] and retired.instances == []

    restarted = SnapshotLoop(fleet, kv, nc.max_payload)  # the bus process restarts
    await restarted.tick()
    assert await _stored(kv, "small") == (generation + 1, set())  # retiring is idempotent

    with fleet() as s, s.begin():  # created again under the same name, placed on at once
        _create(s, "clusters", ClusterSpec(name="small", region="use1", pools=["p1"]))
        _place(s, "chat", "small")
    # generation 1 is below the retired key's: the control plane never issued that one, so it
    # starts a new epoch and the next tick publishes above the retired snapshot
    await restarted.tick()
    await restarted.tick()
    stored, _ = await current_desired(kv, "small")
    assert stored is not None and {d.name for d in stored.deployments} == {"chat"}
    assert stored.version > retired.version


async def test_a_key_it_cannot_read_does_not_stop_the_publisher(fleet, small_nats):
    """A corrupt entry (a restored bucket, a hand edit) under a name PostgreSQL has no
    cluster for: retiring it raised out of the loop, and the bus process exited at every
    start — no desired state published, no report consumed."""
    nc, kv = small_nats
    await kv.put("ghost", b"{not json")
    await kv.put("Not_A_Cluster", b"{}")
    loop = SnapshotLoop(fleet, kv, nc.max_payload)
    await loop.tick()
    assert await _stored(kv, "small") == (_generation(fleet, "small"), {"chat"})
    await loop.tick()  # and again: nothing raised, nothing left to retry


async def test_a_cluster_made_again_before_the_bus_noticed_starts_from_nothing(fleet, small_nats):
    """Deleted and created again between two ticks (a Terraform replace): the key still held
    the old cluster's snapshot, and the new cluster's agent ran it."""
    nc, kv = small_nats
    loop = SnapshotLoop(fleet, kv, nc.max_payload)
    await loop.tick()
    assert (await _stored(kv, "small") or (0, set()))[1] == {"chat"}
    with fleet() as s, s.begin():
        inventory.delete(s, KINDS["clusters"], "small", ACTOR)
        _create(s, "clusters", ClusterSpec(name="small", region="use1", pools=["p1"]))
    await loop.tick()
    await loop.tick()
    stored, _ = await current_desired(kv, "small")
    assert stored is not None and stored.deployments == [] and stored.instances == []
