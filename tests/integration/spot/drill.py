"""The spot drill: a spot notice under steady load, both planes real, measured end to end.

Control plane: PostgreSQL (the caller's migrated database), `run_bus` in this process with
its re-plan hook running `replan` here and carrying procurement out synchronously on the
local provider. Workload planes: agents in this process over an authorized NATS, each with
ProcessRuntime (engine-sim replicas) and its router. The spot pool's capacity is two spot
instances held from the local provider; the on-demand pool has a quota and nothing held.
Clients load `spot-a`'s router in a closed loop. The notice comes from the provider
(`LocalProvider.interrupt`) and is reported by `spot-a`'s agent (its
`SpotInterruptionNoticed` fact), as on a node that reads it from the instance metadata.

Two topologies:
- **one cluster** (`one_cluster=True`): `spot-a` draws on both pools. The re-plan moves one
  replica from the spot pool to the on-demand pool inside the cluster; the desired state's
  per-pool quotas and its instance list (the victim marked draining, with its deadline) tell
  the agent which replica must go: the one on the victim instance. Make before break: the
  agent starts the replacement first and drains the victim's replica once it is ready (or
  `DRAIN_LEAD_S` before the deadline, whichever comes first).
- **two clusters**: `spot-a` has the spot pool, `od-b` the on-demand one; the replacement
  starts on `od-b` and `spot-a` drains the replica on the victim at once (a plane cannot see
  another plane's replicas become ready).

At the deadline the provider takes the instance back: replicas still on it are SIGKILLed.

Used by `test_spot_drain.py` (asserts) and `bench/spot.py` (prints), so both measure alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

import controlplane.bus_process as bus_process
from controlplane.bus import (
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.contracts import NatsCredentials, SpotInterruptionNoticed
from controlplane.db import models as m
from controlplane.db.base import Base
from controlplane.db.session import transaction
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port as nats_port
from controlplane.procurement.core import Acquire, Release
from controlplane.procurement.store import plan_procurement
from controlplane.procurement.tasks import Deps, acquire_run, release_run
from controlplane.services import inventory
from controlplane.services.placement import replan
from controlplane.services.resources import KINDS
from controlplane.settings import Settings
from providers.local import LocalProvider
from workloadplane.agent import Agent, ReplicaChanges, serve
from workloadplane.router.core import Router
from workloadplane.runtime.process import ProcessConfig, ProcessRuntime, free_port
from workloadplane.runtime.templates import enginesim_template
from workloadplane.state import DesiredStateStore

DEPLOYMENT = "chat"
SPOT, ON_DEMAND = "lab-spot", "lab-od"
CLUSTER_SPOT, CLUSTER_OD = "spot-a", "od-b"
TOKENS, TOKENS_PER_S = 40, 50  # 0.8 s per request
DRAIN_LEAD_S = 3.0
"""The agents drain a draining instance's replicas this long before its deadline at the
latest (production default: 30 s of a 120 s AWS notice; here the notice is 8 s)."""


@dataclass
class Load:
    """Closed-loop clients: each sends its next request when the last one answered."""

    ok: int = 0
    failures: list[str] = field(default_factory=list)
    """One entry per failed request: status code and body head, or the exception."""


@dataclass
class DrillResult:
    notice_s: float
    decided_s: float = float("nan")
    """Notice → the re-plan committed with the replacement placed on `od-b` and its
    instance requested (the fact crosses NATS, the consumer records it, the hook re-plans)."""
    procured_s: float = float("nan")
    """→ the replacement instance running at the provider (acquired right after the
    re-plan's commit, as the `gpufleet.acquire` task would be)."""
    one_cluster: bool = False
    drain_started_s: float = float("nan")
    """→ a `spot-a` replica draining (the router sends it nothing new)."""
    drained_replica_instance: str | None = None
    """The instance the drained replica ran on (the victim, when the right one drained)."""
    replacement_ready_at_drain: bool = False
    """Whether a replacement replica was ready when the drain began (make before break)."""
    victim: str = ""
    in_flight_at_drain: int = 0
    """Requests the drained replica was serving when its drain began."""
    drain_in_flight: dict[str, int] = field(default_factory=dict)
    """Replica → the router's requests on it when its drain began."""
    drained_s: float = float("nan")
    """→ that replica's process stopped, once its requests were done."""
    replacement_ready_s: float = float("nan")
    """→ the replacement replica (on the on-demand pool) routable in its plane's router."""
    released_s: float = float("nan")
    """→ the interrupted instance released at the provider (at its deadline)."""
    lost_at_deadline: list[str] = field(default_factory=list)
    """Replicas still running on the victim at the deadline: the provider takes the
    instance back, so they are killed (SIGKILL)."""
    spot: Load = field(default_factory=Load)
    replacement: Load = field(default_factory=Load)
    replans: list[str] = field(default_factory=list)
    final: dict[str, list[str]] = field(default_factory=dict)
    """Replica states per cluster at the end."""

    @property
    def requests(self) -> int:
        return self.spot.ok + self.replacement.ok + self.failed

    @property
    def failed(self) -> int:
        return len(self.spot.failures) + len(self.replacement.failures)


# -- the fleet --------------------------------------------------------------------------------


def truncate(engine: Engine) -> None:
    names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} CASCADE"))


def build_fleet(factory: sessionmaker[Session], one_cluster: bool) -> dict[str, NatsCredentials]:
    """Through the inventory service (the API's validation); returns each cluster's NATS
    credentials, shown once as the API would."""
    clusters: list[tuple[str, dict[str, Any]]] = (
        [("clusters", {"name": CLUSTER_SPOT, "region": "lab-local", "pools": [SPOT, ON_DEMAND]})]
        if one_cluster else
        [("clusters", {"name": CLUSTER_SPOT, "region": "lab-local", "pools": [SPOT]}),
         ("clusters", {"name": CLUSTER_OD, "region": "lab-local", "pools": [ON_DEMAND]})]
    )  # fmt: skip
    place = {"spot_allowed": True, "max_spot_fraction": 1.0}
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("providers", {"name": "lab", "provider_kind": "local", "provider_class": "neocloud",
                       "certifications": [], "credentials_ref": None}),
        ("regions", {"name": "lab-local", "provider": "lab", "code": "local",
                     "jurisdiction": "US", "latitude": 0.0, "longitude": 0.0}),
        ("gpu-types", {"name": "L4", "memory_gib": 24}),
        ("pools", {"name": SPOT, "provider": "lab", "region": "lab-local", "gpu_type": "L4",
                   "purchase_type": "spot", "gpus": 0, "gpus_per_instance": 1,
                   "price_per_gpu_hour": "0.40"}),
        ("pools", {"name": ON_DEMAND, "provider": "lab", "region": "lab-local",
                   "gpu_type": "L4", "purchase_type": "on_demand", "gpus": 0,
                   "gpus_per_instance": 1, "price_per_gpu_hour": "1.00", "quota_gpus": 4}),
        *clusters,
        ("deployments", {"name": DEPLOYMENT, "model_id": DEPLOYMENT, "gpus_per_replica": 1,
                         "gpu_types": ["L4"], "engine_args": ["--tokens-per-s", str(TOKENS_PER_S)],
                         "autoscaling": {"min_replicas": 2, "max_replicas": 2,
                                         "concurrency_target": 16},
                         "placement": place}),
    ]  # fmt: skip
    creds: dict[str, NatsCredentials] = {}
    with transaction(factory) as s:
        for path, body in bodies:
            kind = KINDS[path]
            done = inventory.create(
                s, kind, inventory.parse_spec(kind, body), inventory.Actor("spot-drill")
            )
            if done.secrets and "nats_credentials" in done.secrets:
                creds[body["name"]] = NatsCredentials.model_validate(
                    done.secrets["nats_credentials"]
                )
        # both agents are about to heartbeat; healthy from the start keeps the first plan
        # from seeing only one of them
        for cluster in s.scalars(select(m.Cluster)):
            cluster.state = "healthy"
    return creds


def pool_id(factory: sessionmaker[Session], name: str) -> str:
    with factory() as s:
        return s.scalars(select(m.Pool.id).where(m.Pool.name == name)).one()


def instances(factory: sessionmaker[Session], pool: str) -> dict[str, str]:
    """Provider instance id → state, in `pool`."""
    with factory() as s:
        rows = s.execute(
            select(m.Instance.provider_instance_id, m.Instance.state)
            .join(m.Pool, m.Pool.id == m.Instance.pool_id)
            .where(m.Pool.name == pool)
        ).all()
    return {iid or "": state for iid, state in rows}


def carry_out(d: Deps, actions: list[Any]) -> None:
    """What `dispatch` sends to Celery, run here (after the plan's commit)."""
    for a in actions:
        if isinstance(a, Acquire):
            acquire_run(d, a.pool_id, a.count, a.request_id, a.cluster_id)
        elif isinstance(a, Release):
            release_run(d, a.instance_id)


class Replanner:
    """The bus process's re-plan hook, in process: `replan` then procurement at once.
    Serialised, and never skipped: a re-plan that finds another one running waits for it
    (the Celery task would return without planning, see the docs)."""

    def __init__(self, d: Deps) -> None:
        self.deps = d
        self.lock = threading.Lock()
        self.log: list[tuple[str, float, float, list[Any]]] = []
        """(reason, committed at, procurement carried out at, actions), perf_counter times."""

    def __call__(self, reason: str) -> None:
        with self.lock:
            for _ in range(500):  # another process's re-plan: 5 s at most
                with transaction(self.deps.factory) as s:
                    done = replan(s, reason)
                if done is not None:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError(f"re-plan ({reason}) never got the lock")
            committed = time.perf_counter()
            carry_out(self.deps, done.actions)
            self.log.append((reason, committed, time.perf_counter(), done.actions))


@contextlib.contextmanager
def patched(replanner: Replanner, controlplane: NatsCredentials) -> Iterator[None]:
    """The bus process's hook and NATS login, restored afterwards."""
    saved_hook = bus_process.trigger_replan
    saved_env = {k: os.environ.get(k) for k in ("GPUFLEET_NATS_USER", "GPUFLEET_NATS_PASSWORD")}
    bus_process.trigger_replan = replanner
    os.environ["GPUFLEET_NATS_USER"] = controlplane.user
    os.environ["GPUFLEET_NATS_PASSWORD"] = controlplane.password
    try:
        yield
    finally:
        bus_process.trigger_replan = saved_hook
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- the planes -------------------------------------------------------------------------------


@dataclass
class Plane:
    agent: Agent
    runtime: ProcessRuntime
    router: Router
    url: str

    def routable(self, pool: str | None = None) -> list[str]:
        on_pool = {rid for rid, r in self.runtime._replicas.items() if pool in (None, r.pool)}
        return [
            b.replica_id
            for b in self.router.backends.values()
            if b.deployment == DEPLOYMENT and b.routable and b.replica_id in on_pool
        ]

    async def states(self) -> dict[str, str]:
        return {r.replica_id: r.state for r in await self.runtime.list_replicas()}

    async def on_instance(self, instance: str) -> dict[str, str]:
        """Replica id → state, of the replicas on `instance`."""
        return {
            r.replica_id: r.state
            for r in await self.runtime.list_replicas()
            if r.instance == instance
        }


@contextlib.asynccontextmanager
async def plane(
    cluster: str, nats_url: str, creds: NatsCredentials, tmp: Path
) -> AsyncIterator[Plane]:
    router = Router()
    changes = ReplicaChanges(router)
    runtime = ProcessRuntime(
        enginesim_template(),
        tmp / cluster / "runtime",
        config=ProcessConfig(health_interval_s=0.5, backoff_initial_s=0.2),
        watcher=changes,
        in_flight=router,
    )
    agent = Agent(
        cluster,
        runtime,
        DesiredStateStore(tmp / cluster / "state", fsync=False),
        router=router,
        changes=changes,
        drain_lead=timedelta(seconds=DRAIN_LEAD_S),
    )
    port, stop = free_port(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            agent,
            nats_url,
            creds,
            heartbeat_interval=0.5,
            reconcile_interval=0.5,
            stop=stop,
            router_address=("127.0.0.1", port),
        )
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client, asyncio.timeout(15):
            while True:
                if task.done():
                    task.result()  # raises what stopped it
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{url}/health")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
        yield Plane(agent, runtime, router, url)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await task
        await runtime.close()


async def closed_loop(url: str, clients: int, stop: asyncio.Event, load: Load) -> None:
    """Streaming requests (0.8 s each): a stream already flowing from a replica that dies
    cannot move to another one, so a drain that is not graceful shows up here as a failed
    request (non-streaming ones would be retried by the router). The clients start spread
    over one request's duration, so every replica always has requests in flight."""
    body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients)) as c:

        async def user(i: int) -> None:
            await asyncio.sleep(i * TOKENS / TOKENS_PER_S / clients)
            while not stop.is_set():
                try:
                    async with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                        events = [line async for line in r.aiter_lines() if line.strip()]
                except httpx.HTTPError as exc:
                    load.failures.append(repr(exc))
                    continue
                problem = _stream_problem(r.status_code, events)
                if problem:
                    load.failures.append(problem)
                else:
                    load.ok += 1

        await asyncio.gather(*(user(i) for i in range(clients)))


def _stream_problem(status: int, events: list[str]) -> str | None:
    """Why a streamed answer is not a complete one, or None."""
    if status != 200:
        return f"{status} {' '.join(events)[:200]}"
    if not events or events[-1] != "data: [DONE]":
        return f"no [DONE]: {events[-2:]}"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    if any("error" in chunk for chunk in chunks):
        return f"error event: {[c for c in chunks if 'error' in c]}"
    usage = (chunks[-1].get("usage") or {}) if chunks else {}
    if usage.get("completion_tokens") != TOKENS:
        return f"incomplete: usage {usage}"
    return None


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded wait for real processes (no clock to inject)."""
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}") from None


# -- the drill --------------------------------------------------------------------------------


async def run_drill(
    factory: sessionmaker[Session],
    database_url: str,
    tmp: Path,
    *,
    notice_s: float = 8.0,
    clients: int = 4,
    warm_s: float = 2.0,
    one_cluster: bool = False,
) -> DrillResult:
    """One drill on an empty, migrated database; the caller truncates it afterwards."""
    creds = build_fleet(factory, one_cluster)
    local = LocalProvider(gpus_total=8, state_path=tmp / "local.json")
    d = Deps(factory=factory, providers=lambda row: local, replan=lambda reason: None)
    with transaction(factory) as s:  # the spot capacity: two instances, held before any plan
        held = plan_procurement(s, {SPOT: 2}, datetime.now(UTC), d.policy)
    carry_out(d, held)
    replanner = Replanner(d)
    d.replan = replanner

    controlplane = generate_controlplane_credentials()
    with factory() as s:
        users = {
            c.name: NatsCredentials(user=c.nats_user, password=c.nats_password_hash)
            for c in s.scalars(select(m.Cluster))
            if c.nats_user and c.nats_password_hash
        }
    port = nats_port()
    config = write_server_config(
        tmp / "nats.conf",
        render_server_config(
            controlplane=controlplane, clusters=users, store_dir=tmp / "js", port=port
        ),
    )
    server = NatsServer(store_dir=tmp / "js", port=port, config_file=config).start()
    result = DrillResult(notice_s=notice_s, one_cluster=one_cluster)
    stop_bus, stop_load = asyncio.Event(), asyncio.Event()
    try:
        with patched(replanner, controlplane):
            bus = asyncio.create_task(
                bus_process.run_bus(
                    Settings(database_url=database_url, nats_url=server.url), stop_bus, poll_s=0.05
                )
            )
            try:
                async with contextlib.AsyncExitStack() as planes:
                    a = await planes.enter_async_context(
                        plane(CLUSTER_SPOT, server.url, creds[CLUSTER_SPOT], tmp)
                    )
                    b = a if one_cluster else await planes.enter_async_context(
                        plane(CLUSTER_OD, server.url, creds[CLUSTER_OD], tmp)
                    )  # fmt: skip
                    _note_in_flight_at_drain(a, result)
                    await asyncio.to_thread(replanner, "initial")
                    await until(lambda: len(a.routable()) == 2, 30, "2 replicas on spot-a")
                    loads = [
                        asyncio.create_task(closed_loop(a.url, clients, stop_load, result.spot))
                    ]
                    await asyncio.sleep(warm_s)  # steady load before the notice
                    await _notice_and_follow(
                        result, replanner, local, factory, a, b, loads, stop_load, clients
                    )
                    stop_load.set()
                    await asyncio.gather(*loads)
                    result.final = {
                        CLUSTER_SPOT: sorted((await a.states()).values()),
                        **({} if one_cluster else
                           {CLUSTER_OD: sorted((await b.states()).values())}),
                    }  # fmt: skip
            finally:
                stop_load.set()
                stop_bus.set()
                with contextlib.suppress(Exception):
                    await bus
    finally:
        server.stop()
    result.replans = [reason for reason, *_ in replanner.log]
    return result


def _note_in_flight_at_drain(a: Plane, result: DrillResult) -> None:
    """What the router had in flight on a replica the moment its drain began (read after
    the fact, by polling states, a loaded machine may have finished them already)."""
    drain = a.runtime.drain

    async def noted(replica_id: str) -> None:
        if a.runtime.state(replica_id) == "ready":
            result.drain_in_flight[replica_id] = a.router.replica_in_flight(replica_id) or 0
        await drain(replica_id)

    a.runtime.drain = noted  # type: ignore[method-assign]


async def _notice_and_follow(
    result: DrillResult,
    replanner: Replanner,
    local: LocalProvider,
    factory: sessionmaker[Session],
    a: Plane,
    b: Plane,
    loads: list[asyncio.Task[None]],
    stop_load: asyncio.Event,
    clients: int,
) -> None:
    victim = sorted(i for i, state in instances(factory, SPOT).items() if state == "running")[0]
    result.victim = victim
    assert await a.on_instance(victim), f"no replica on the victim {victim} to begin with"
    seen, od = len(replanner.log), pool_id(factory, ON_DEMAND)
    local.interrupt(victim, notice=timedelta(seconds=result.notice_s))
    (notice,) = [n for n in local.interruption_notices() if n.instance_id == victim]
    t0 = time.perf_counter()
    assert a.agent.bus is not None
    a.agent.bus.publish_fact(
        SpotInterruptionNoticed(
            cluster=CLUSTER_SPOT,
            source=f"cluster/{CLUSTER_SPOT}",
            instance_id=victim,
            pool=SPOT,
            deadline=notice.deadline,
        )
    )

    def replacement_planned() -> bool:
        # whichever re-plan runs first after the notice decides (a heartbeat's may win)
        for _, committed, procured, actions in replanner.log[seen:]:
            if any(isinstance(x, Acquire) and x.pool_id == od for x in actions):
                result.decided_s, result.procured_s = committed - t0, procured - t0
                return True
        return False

    await until(replacement_planned, 5, "the re-plan after the notice to request a replacement")
    drained: str | None = None
    deadline = t0 + result.notice_s
    while time.perf_counter() < deadline + 0.5:
        now = time.perf_counter() - t0
        states = await a.states()
        if drained is None:
            for rid, state in states.items():
                if state == "draining":
                    drained, result.drain_started_s = rid, now
                    result.in_flight_at_drain = result.drain_in_flight.get(rid, 0)
                    result.drained_replica_instance = a.runtime._replicas[rid].instance
                    result.replacement_ready_at_drain = any(
                        r.pool == ON_DEMAND and r.state == "ready"
                        for r in b.runtime._replicas.values()
                    )
        elif drained not in states and math.isnan(result.drained_s):
            result.drained_s = now
        if b.routable(ON_DEMAND) and math.isnan(result.replacement_ready_s):
            result.replacement_ready_s = now
            if b is not a:  # one cluster: the same clients reach it through `spot-a`'s router
                loads.append(
                    asyncio.create_task(
                        closed_loop(b.url, max(1, clients // 2), stop_load, result.replacement)
                    )
                )
        if time.perf_counter() >= deadline and math.isnan(result.released_s):
            result.lost_at_deadline = await reclaim(a, victim)
            await asyncio.to_thread(replanner, "drain deadline")  # the 30 s timer, due now
            if victim not in {i.id for i in local.list_instances()}:
                result.released_s = time.perf_counter() - t0
            else:
                result.released_s = float("inf")  # not released: the caller asserts
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # a little load on the plan that results


async def reclaim(a: Plane, victim: str) -> list[str]:
    """The provider taking the instance back at the deadline: the replicas still running on
    it are lost (SIGKILL, as a vanished machine)."""
    lost = sorted(await a.on_instance(victim))
    for rid in lost:
        pid = a.runtime._replicas[rid].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return lost
