"""A placement that needs more than a pool holds asks procurement for exactly the missing
instances, once; what the declared capacity covers is never bought."""

from __future__ import annotations

from sqlalchemy import select, update

from controlplane.db import models as m
from controlplane.procurement.core import Acquire
from controlplane.services.placement import replan
from tests.integration.api import builders as b


def _fleet(admin, pool_gpus: int) -> None:
    for path, body in (
        ("providers", b.provider("lab", provider_kind="local", provider_class="neocloud",
                                 credentials_ref=None, certifications=[])),
        ("regions", b.region("lab-tokyo", provider="lab", code="tokyo", jurisdiction="JP")),
        ("gpu-types", b.gpu_type()),
        ("pools", b.pool("lab-h100", provider="lab", region="lab-tokyo", gpus=pool_gpus,
                         gpus_per_instance=8, quota_gpus=32)),
        ("clusters", b.cluster("lab-a", region="lab-tokyo", pools=["lab-h100"])),
        ("deployments", b.deployment(gpus_per_replica=8,
                                     autoscaling={"min_replicas": 2, "max_replicas": 2})),
    ):  # fmt: skip
        assert admin.post(path, body).status_code == 201, path


def test_missing_capacity_is_procured_once(admin, session_factory):
    _fleet(admin, pool_gpus=0)
    with session_factory() as s, s.begin():
        s.execute(update(m.Cluster).values(state="healthy"))
    with session_factory() as s, s.begin():
        done = replan(s, "test")
    assert done is not None
    assert done.summary["deployments"]["chat-llm"]["placed_replicas"] == 2
    acquires = [a for a in done.actions if isinstance(a, Acquire)]
    assert sum(a.count for a in acquires) == 2  # two 8-GPU instances for two 8-GPU replicas
    with session_factory() as s:
        rows = list(s.scalars(select(m.Instance)))
    assert [r.state for r in rows] == ["requested", "requested"]
    assert len({r.idempotency_key for r in rows}) == 2

    with session_factory() as s, s.begin():
        again = replan(s, "test")
    assert again is not None
    assert not [a for a in again.actions if isinstance(a, Acquire)]  # requested rows count


def test_declared_capacity_is_used_before_buying(admin, session_factory):
    _fleet(admin, pool_gpus=16)
    with session_factory() as s, s.begin():
        s.execute(update(m.Cluster).values(state="healthy"))
    with session_factory() as s, s.begin():
        done = replan(s, "test")
    assert done is not None
    assert done.summary["deployments"]["chat-llm"]["placed_replicas"] == 2
    assert not [a for a in done.actions if isinstance(a, Acquire)]
