"""Both sides of the boundary between the plane's router process and its agent, without
processes: the router follows the runtime's record and the last snapshot from the agent's
state directory; the agent's ``RemoteRouter`` turns the router's load report into the
signals the autoscaler and drains use."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.unit.workloadplane.builders import make_deployment, make_desired, make_replica
from workloadplane.router.core import Router, Ticket
from workloadplane.router.follower import PlaneFollower
from workloadplane.router.remote import RemoteRouter
from workloadplane.state import DesiredStateStore


def record(state_dir: Path, *replicas: tuple[str, str]) -> None:
    """Write the runtime's record (as ProcessRuntime does): (replica id, state) pairs."""
    rows = [
        {"replica_id": rid, "deployment": "chat", "spec": {"model_id": "m", "revision": "r1"},
         "port": 9000 + i, "gpus": [], "pid": 100 + i, "state": state,
         "endpoint": f"http://127.0.0.1:{9000 + i}", "started_at": "2026-12-01T00:00:00+00:00"}
        for i, (rid, state) in enumerate(replicas)
    ]  # fmt: skip
    runtime = state_dir / "runtime"
    runtime.mkdir(exist_ok=True)
    (runtime / "replicas.json.tmp").write_text(json.dumps(rows))
    (runtime / "replicas.json.tmp").replace(runtime / "replicas.json")


def test_the_router_follows_the_record_and_the_snapshot(tmp_path: Path):
    router = Router()
    follower = PlaneFollower(router, tmp_path)
    follower.poll()  # nothing written yet: nothing served, nothing fails
    assert router.model_ids() == [] and router.backends == {}
    DesiredStateStore(tmp_path, fsync=False).save(make_desired(3, make_deployment("chat")))
    record(tmp_path, ("chat-1", "ready"), ("chat-2", "starting"))
    follower.poll()
    assert follower.generation == 3 and router.model_ids() == [("chat", None)]
    assert {rid: b.routable for rid, b in router.backends.items()} == {
        "chat-1": True,
        "chat-2": False,
    }
    record(tmp_path, ("chat-1", "draining"), ("chat-2", "ready"))
    follower.poll()
    assert router.backends["chat-1"].state == "draining" and router.backends["chat-2"].routable
    record(tmp_path, ("chat-2", "ready"))
    follower.poll()
    assert list(router.backends) == ["chat-2"]


def test_a_snapshot_written_during_a_read_is_read_again(tmp_path: Path):
    """A slot read while the agent writes it looks torn, and the write may not change its
    stat again: the follower reads every change twice, one poll apart."""
    router = Router()
    follower = PlaneFollower(router, tmp_path)
    store = DesiredStateStore(tmp_path, fsync=False)
    store.save(make_desired(1, make_deployment("chat")))
    follower.poll()
    store.save(make_desired(2, make_deployment("chat"), make_deployment("code")))
    slot = tmp_path / "desired-state.1"
    whole = slot.read_bytes()
    slot.write_bytes(whole[:-1] + b"?")  # what the first read sees: half-written
    seen = os.stat(slot)
    follower.poll()
    assert follower.generation == 1
    slot.write_bytes(whole)  # the write completes within the same stat
    os.utime(slot, ns=(seen.st_atime_ns, seen.st_mtime_ns))
    follower.poll()
    assert follower.generation == 2 and {m for m, _ in router.model_ids()} == {"chat", "code"}


def test_a_new_epoch_at_the_same_generation_reaches_the_router(tmp_path: Path):
    """A control plane restored behind the plane starts a new epoch at the generation the
    plane holds: the agent applied it, the router's follower compared generations only and
    kept serving the old deployments."""
    router = Router()
    follower = PlaneFollower(router, tmp_path)
    store = DesiredStateStore(tmp_path, fsync=False)
    store.save(make_desired(5, make_deployment("chat")))
    follower.poll()
    fresh = make_desired(5, make_deployment("code")).model_copy(update={"epoch": 1})
    store.save(fresh)
    follower.poll()
    assert follower.version == (1, 5) and {m for m, _ in router.model_ids()} == {"code"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def report(**replicas: tuple[int, str]) -> dict:
    return {
        "deployments": {"chat": {"in_flight": 3, "queued": 2, "at_zero": False}},
        "replicas": {r: {"in_flight": n, "state": s} for r, (n, s) in replicas.items()},
    }


def test_the_agent_reads_the_routers_load_across_the_boundary():
    clock = Clock()
    remote = RemoteRouter("127.0.0.1", 1, clock=clock)
    remote.apply_report(report(a=(3, "ready")), clock())
    assert remote.load("chat") == (3, 2) and remote.replica_in_flight("a") == 3
    assert remote.load("other") == (0, 0) and remote.replica_in_flight("b") == 0
    clock.now += 2.5  # the router stopped answering: what runs on a replica is not known
    assert not remote.fresh and remote.replica_in_flight("a") is None
    assert remote.load("chat") == (0, 0)  # the heartbeat's counts only


@pytest.mark.parametrize(
    "bad",
    [[], {"deployments": []}, {"deployments": {"chat": None}, "replicas": {}},
     {"deployments": {}, "replicas": {"a": {"in_flight": "x", "state": "ready"}}}],
)  # fmt: skip
def test_an_answer_of_the_wrong_shape_changes_nothing_and_is_caught_by_the_poller(bad):
    """A list or a null where a map was raised AttributeError/TypeError, which the poller
    did not catch: it died, and the plane's load went stale for good."""
    from workloadplane.router.remote import MALFORMED

    clock = Clock()
    remote = RemoteRouter("127.0.0.1", 1, clock=clock)
    remote.apply_report(report(a=(3, "ready")), clock())
    with pytest.raises(MALFORMED):
        remote.apply_report(bad, clock())
    assert remote.load("chat") == (3, 2) and remote.replica_in_flight("a") == 3


def test_a_drain_waits_until_the_router_has_seen_it():
    clock = Clock()
    remote = RemoteRouter("127.0.0.1", 1, clock=clock)
    remote.set_deployments([make_deployment("chat")])
    replica = make_replica("a", state="draining").model_copy(update={"endpoint": "http://h:1"})
    remote.set_replicas([replica])  # the runtime marked it draining, synchronously
    remote.apply_report(report(a=(0, "ready")), clock())  # the router not yet
    assert remote.replica_in_flight("a") == 1
    remote.apply_report(report(a=(0, "draining")), clock())
    assert remote.replica_in_flight("a") == 0


async def test_a_drain_waits_while_the_routers_count_is_unknown(tmp_path: Path):
    """The router stops answering /internal/load with a request on the draining replica: a
    stale report counted 0 in flight, and the drain stopped the replica under it."""
    from controlplane.contracts import RevisionSpec
    from workloadplane.runtime.gpus import GpuAllocator
    from workloadplane.runtime.process import ProcessRuntime, _Replica
    from workloadplane.runtime.templates import CommandTemplate

    clock = Clock()
    remote = RemoteRouter("127.0.0.1", 1, clock=clock)
    runtime = ProcessRuntime(CommandTemplate(["true"]), tmp_path, clock=clock, in_flight=remote,
                             gpus=GpuAllocator([], real=False))  # fmt: skip
    spec = RevisionSpec(model_id="m", revision="r1")
    runtime._replicas["a"] = _Replica("a", "chat", spec, 1, [], state="ready")  # no process
    remote.apply_report(report(a=(1, "draining")), clock())  # one request on it
    await runtime.drain("a")
    clock.now += 2.5  # the router stopped answering; the drain deadline is 30 s away
    for _ in range(5):  # the drain looks every 0.1 s
        await asyncio.sleep(0.1)
    assert [r.state for r in await runtime.list_replicas()] == ["draining"]
    remote.apply_report(report(a=(0, "draining")), clock())  # it answers: nothing in flight
    for _ in range(50):
        if not await runtime.list_replicas():
            break
        await asyncio.sleep(0.1)
    assert await runtime.list_replicas() == []
    await runtime.close()


async def test_a_request_waiting_at_zero_wakes_the_agents_autoscaler():
    router = Router()
    router.set_deployments([make_deployment("chat", min_=0)])
    entry = router.deployments["chat"]
    entry.queue.offer(Ticket(tier=1), 1, router.clock())
    assert router.load_report()["deployments"]["chat"] == {
        "in_flight": 0,
        "queued": 1,
        "at_zero": True,
    }
    remote = RemoteRouter("127.0.0.1", 1)
    remote.apply_report(json.loads(json.dumps(router.load_report())), remote.clock())
    assert await remote.scale_from_zero.take(0.1) == {"chat"}


def test_a_deployment_dropped_from_the_snapshot_goes_once_its_last_replica_has(tmp_path: Path):
    """The agent applies a snapshot first and drains its replicas after: the router, seeing
    the new snapshot while the replicas still run, must still let the model go once they
    are gone (a deleted deployment was served — listed in /v1/models — forever)."""
    router = Router()
    follower = PlaneFollower(router, tmp_path)
    store = DesiredStateStore(tmp_path, fsync=False)
    store.save(make_desired(1, make_deployment("chat")))
    record(tmp_path, ("chat-1", "ready"))
    follower.poll()
    assert router.model_ids() == [("chat", None)]
    store.save(make_desired(2))  # chat dropped; its replica is still draining
    record(tmp_path, ("chat-1", "draining"))
    follower.poll()
    # its replica finishes what it has, but the model takes no new request (issue: a
    # deleted deployment still resolved, and its requests queued for 120 s)
    assert "chat" in router.deployments and router.model_ids() == []
    assert router.resolve("chat") is None
    record(tmp_path)  # the replica is gone
    follower.poll()
    follower.poll()
    assert "chat" not in router.deployments


def test_token_counters_cross_the_boundary_and_name_the_routers_start():
    router = Router()
    router.count_usage("chat", 120, 30, 900)
    router.count_usage("chat", 80, 20, 600)
    assert router.usage("code") is None
    remote = RemoteRouter("127.0.0.1", 1)
    remote.apply_report(json.loads(json.dumps(router.load_report())), remote.clock())
    usage = remote.usage("chat")
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.response_bytes) == (200, 50, 1500)
    assert usage.since == router.since != Router().since  # a restarted router: a new `since`
    remote.apply_report(report(a=(0, "ready")), remote.clock())  # an older router's report
    assert remote.usage("chat") is None
