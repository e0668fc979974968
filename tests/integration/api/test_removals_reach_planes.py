"""Issue 12 item 1 at the service level: every change that removes something bumps exactly
the clusters whose desired state it changes, in its own transaction (a re-plan after the
rows are gone could not tell), and their next snapshot no longer carries what was removed.

The world: pools p1 and p2; cluster a draws on p1, b on p1 and p2, c on p2. Deployment d1
runs on a and b (p1), d2 on c (p2), d3 on b (p2). Placements are written as a re-plan would.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from controlplane.services.desired import desired_state, retired_deployments
from tests.integration.api import builders as b

PLACED = {("d1", "a", "p1"): 2, ("d1", "b", "p1"): 1, ("d2", "c", "p2"): 1, ("d3", "b", "p2"): 1}


@pytest.fixture
def world(admin, session_factory: sessionmaker[Session]):
    for path, body in (
        ("providers", b.provider()),
        ("regions", b.region()),
        ("gpu-types", b.gpu_type()),
        ("pools", b.pool("p1")),
        ("pools", b.pool("p2")),
        ("clusters", b.cluster("a", pools=["p1"])),
        ("clusters", b.cluster("b", pools=["p1", "p2"])),
        ("clusters", b.cluster("c", pools=["p2"])),
        *(("deployments", b.deployment(d)) for d in ("d1", "d2", "d3")),
    ):
        response = admin.post(path, body)
        assert response.status_code == 201, response.text
    with session_factory() as s, s.begin():
        ids = {
            name: row_id
            for row_type in (m.Deployment, m.Cluster, m.Pool)
            for name, row_id in s.execute(select(row_type.name, row_type.id))
        }
        for (dep, cluster, pool), replicas in PLACED.items():
            s.add(
                m.Placement(
                    deployment_id=ids[dep],
                    cluster_id=ids[cluster],
                    pool_id=ids[pool],
                    replicas=replicas,
                    max_replicas=replicas,
                )
            )
        s.execute(update(m.Cluster).values(desired_generation=5, state="healthy"))
    return admin


def _generations(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as s:
        return dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())


def _bumped(factory: sessionmaker[Session]) -> set[str]:
    return {name for name, g in _generations(factory).items() if g > 5}


def _runs(factory: sessionmaker[Session], cluster: str) -> set[str]:
    with factory() as s:
        row = s.scalars(select(m.Cluster).where(m.Cluster.name == cluster)).one()
        return {d.name for d in desired_state(s, row).deployments}


def test_deleting_a_deployment_bumps_the_clusters_it_runs_on(world, session_factory):
    assert _runs(session_factory, "a") == {"d1"}
    assert world.delete("deployments/d1").status_code == 204

    assert _bumped(session_factory) == {"a", "b"}
    assert _runs(session_factory, "a") == set()
    assert _runs(session_factory, "b") == {"d3"}


def test_force_deleting_a_deployment_with_replicas_bumps_where_they_run(world, session_factory):
    """A replica on a cluster the deployment is no longer placed on (leaving a draining
    instance) still runs there: that cluster must hear of the delete too."""
    with session_factory() as s, s.begin():
        d2 = s.scalars(select(m.Deployment.id).where(m.Deployment.name == "d2")).one()
        a = s.scalars(select(m.Cluster.id).where(m.Cluster.name == "a")).one()
        s.add(m.Replica(name="d2-1", deployment_id=d2, cluster_id=a, state="ready"))
    assert world.delete("deployments/d2").status_code == 409  # it still has a replica
    assert _bumped(session_factory) == set()

    assert world.delete("deployments/d2?force=true").status_code == 204
    assert _bumped(session_factory) == {"a", "c"}


def test_deleting_a_cluster_bumps_the_clusters_sharing_its_deployments(world, session_factory):
    assert world.delete("clusters/a").status_code == 204

    assert _bumped(session_factory) == {"b"}  # d1's whole share moves to b
    with session_factory() as s:
        b_row = s.scalars(select(m.Cluster).where(m.Cluster.name == "b")).one()
        d1 = next(d for d in desired_state(s, b_row).deployments if d.name == "d1")
    assert d1.routing_weight == 1.0


def test_a_cluster_leaving_a_pool_stops_what_it_ran_there(world, session_factory):
    assert world.patch("clusters/b", {"pools": ["p1"]}).status_code == 200

    assert _bumped(session_factory) == {"b"}
    assert _runs(session_factory, "b") == {"d1"}  # d3 ran on p2; d1 on p1 stays


def test_a_pool_emptied_stops_what_ran_on_it(world, session_factory):
    assert world.patch("pools/p2", {"gpus": 0}).status_code == 200

    assert _bumped(session_factory) == {"b", "c"}
    assert _runs(session_factory, "b") == {"d1"}
    assert _runs(session_factory, "c") == set()


def test_a_pool_that_only_shrinks_bumps_nothing_by_itself(world, session_factory):
    """Fewer GPUs is the next re-plan's business: nothing was removed yet."""
    assert world.patch("pools/p2", {"gpus": 8}).status_code == 200
    assert _bumped(session_factory) == set()


def test_deleting_a_pool_bumps_the_clusters_still_placed_on_it(world, session_factory):
    """A pool can go once no cluster draws on it; placements a re-plan wrote on it before
    the last link went still reach their clusters' snapshots until then."""
    with session_factory() as s, s.begin():
        s.execute(m.cluster_pools.delete())
    assert world.delete("pools/p2").status_code == 204

    assert _bumped(session_factory) == {"b", "c"}
    assert _runs(session_factory, "c") == set()


def test_changing_a_deployment_bumps_the_clusters_it_runs_on(world, session_factory):
    """Its snapshot entry (engine args, autoscaling) changed there, and nowhere else: under
    the default rollout, a canary's lane beside the stable entry."""
    assert (
        world.patch("deployments/d3", {"engine_args": ["--max-model-len", "8192"]}).status_code
        == 200
    )
    assert _bumped(session_factory) == {"b"}
    assert _runs(session_factory, "b") == {"d1", "d3", "d3--r2"}
    assert (
        world.patch("deployments/d3", {"engine_args": ["--max-model-len", "8192"]}).status_code
        == 200
    )
    assert _generations(session_factory)["b"] == 6  # no change, no bump


def test_a_snapshot_names_only_the_latest_deleted_deployments(admin, session_factory):
    """Every cluster's snapshot lists the deleted deployments (to drain at once): a churn of
    thousands within the hour pushed every snapshot past the payload limit."""
    b.seed(admin)
    for name in ("gone-a", "gone-b", "gone-c"):
        assert admin.post("deployments", b.deployment(name)).status_code == 201
        assert admin.delete(f"deployments/{name}").status_code == 204
    with session_factory() as s:
        assert retired_deployments(s) == ["gone-a", "gone-b", "gone-c"]
        assert retired_deployments(s, most=2) == ["gone-b", "gone-c"]
