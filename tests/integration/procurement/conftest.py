"""Procurement against the real PostgreSQL with the local provider (and moto-backed AWS):
a small fleet builder, a manual clock and a re-plan hook that records what was sent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from controlplane.db.base import Base
from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.procurement.core import Policy
from controlplane.procurement.tasks import Deps
from controlplane.settings import Settings
from controlplane.tasks import REPLAN, Worker, register
from providers.local import LocalProvider

# the moto-backed EC2 fixtures of the provider suite (session servers, started on demand)
from tests.integration.providers.conftest import (  # noqa: F401
    aws_provider,
    ec2_shim,
    interruption_queue,
    moto_port,
)


class Clock:
    """Starts at the wall time (rows get their timestamps from the database's clock), then
    moves only when a test advances it."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Sent:
    """The injected send_task hook: what would have gone to Celery."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def send_task(self, name: str, kwargs: dict[str, Any], **_: Any) -> None:
        self.calls.append((name, kwargs))

    def replan(self, reason: str) -> None:
        self.send_task(REPLAN, kwargs={"reason": reason})

    @property
    def replans(self) -> list[str]:
        return [kw["reason"] for name, kw in self.calls if name == REPLAN]


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, pool_size=4)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def factory(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


@pytest.fixture(autouse=True)
def _empty(engine: Engine) -> None:
    names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} CASCADE"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def local(tmp_path: Path, clock: Clock) -> LocalProvider:
    return LocalProvider(gpus_total=32, state_path=tmp_path / "local.json", clock=clock)


def make_deps(
    factory: sessionmaker[Session], provider: Any, sent: Sent, clock: Clock, **policy: Any
) -> Deps:
    return Deps(
        factory=factory,
        providers=lambda row: provider,
        replan=sent.replan,
        clock=clock,
        policy=Policy(**policy),
    )


def worker_app(d: Deps) -> Celery:
    """A Celery app with the worker's tasks run with `d`: the seam the worker's
    composition root (`controlplane.tasks`) builds its own app through."""
    app = Celery("test-worker", set_as_current=False)
    register(app, lambda: Worker(Settings(), d))
    return app


@pytest.fixture
def deps(factory: sessionmaker[Session], local: LocalProvider, sent: Sent, clock: Clock) -> Deps:
    return make_deps(factory, local, sent, clock)


@dataclass
class Fleet:
    factory: sessionmaker[Session]
    provider_id: str = ""
    region_id: str = ""
    gpu_type_id: str = ""
    cluster_id: str = ""
    n: int = 0

    def pool(self, purchase: str = "on_demand", gpi: int = 8, **fields: Any) -> str:
        self.n += 1
        with transaction(self.factory) as s:
            pool = m.Pool(
                name=f"pool-{self.n}",
                provider_id=self.provider_id,
                region_id=self.region_id,
                gpu_type_id=self.gpu_type_id,
                purchase_type=purchase,
                gpus=0,
                gpus_per_instance=gpi,
                price_per_gpu_hour=Decimal("1.5"),
                **fields,
            )
            s.add(pool)
            s.flush()
            s.execute(m.cluster_pools.insert().values(cluster_id=self.cluster_id, pool_id=pool.id))
            return pool.id

    def deployment_on(
        self, pool_id: str, replicas: int, gpus: int = 8, delay_s: float = 300
    ) -> str:
        with transaction(self.factory) as s:
            dep = m.Deployment(
                name=f"dep-{pool_id[:8]}",
                model_id="m",
                engine_image="vllm",
                gpus_per_replica=gpus,
                autoscaling={"scale_down_delay_s": delay_s},
            )
            s.add(dep)
            s.flush()
            s.add(
                m.Placement(
                    deployment_id=dep.id,
                    cluster_id=self.cluster_id,
                    pool_id=pool_id,
                    replicas=replicas,
                )
            )
            return dep.id


def make_fleet(factory: sessionmaker[Session], kind: str = "local", region: str = "local") -> Fleet:
    with transaction(factory) as s:
        prov = m.Provider(name=f"{kind}-1", kind=kind, provider_class="neocloud")
        s.add(prov)
        s.flush()
        reg = m.Region(
            name=f"{kind}-{region}",
            provider_id=prov.id,
            code=region,
            jurisdiction="US",
            latitude=0.0,
            longitude=0.0,
        )
        gpu = m.GpuType(name="L4" if kind == "local" else "L40S", memory_gib=24)
        s.add_all([reg, gpu])
        s.flush()
        cluster = m.Cluster(name="plane-1", region_id=reg.id, state="healthy")
        s.add(cluster)
        s.flush()
        return Fleet(factory, prov.id, reg.id, gpu.id, cluster.id)


@pytest.fixture
def fleet(factory: sessionmaker[Session]) -> Fleet:
    return make_fleet(factory)
