"""How the planes' reports shape the engine's input (``services.placement``), no database:
a pool counts the smaller of the inventory and its planes' totals; replicas that cannot
start are not counted as placed and nothing more goes where they wait; a summed demand
within the deadband keeps what is placed."""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane import placement as engine
from controlplane.services.capacity import reported_capacity, running_share, usable_gpus
from controlplane.services.placement import planned_demand
from controlplane.status import PoolCapacity

AT = datetime(2026, 12, 1, tzinfo=UTC)


def report(total: int | None, free: int = 0, **waiting: int) -> PoolCapacity:
    return PoolCapacity(total_gpus=total, free_gpus=free, waiting_replicas=waiting, reported_at=AT)


def test_a_plane_with_fewer_gpus_than_the_inventory_wins():
    assert usable_gpus(16, {"cheap": report(8)}) == 8


def test_a_plane_never_raises_the_inventory():
    assert usable_gpus(8, {"cheap": report(16, free=16)}) == 8


def test_no_report_or_no_total_leaves_the_inventory():
    assert usable_gpus(16, {}) == 16
    assert usable_gpus(16, {"old-agent": report(None)}) == 16


def test_planes_sharing_a_pool_add_up():
    assert usable_gpus(32, {"a": report(8), "b": report(16)}) == 24


def test_while_replicas_wait_only_the_running_placed_gpus_count():
    waiting = {"cheap": report(16, free=0, qwen=1)}
    assert usable_gpus(16, waiting, {"cheap": 8}) == 8
    assert usable_gpus(16, waiting) == 0  # nothing of ours runs there: put nothing there


def test_waiting_replicas_are_not_counted_as_placed():
    reports = {"cheap-rsv": {"cheap": report(8, qwen=1)}}
    qwen = engine.Assignment("qwen", "cheap", "cheap-rsv", 2)
    llama = engine.Assignment("llama", "cheap", "cheap-rsv", 1)
    elsewhere = engine.Assignment("qwen", "dear", "cheap-rsv", 1)
    assert running_share(qwen, reports) == 1
    assert running_share(llama, reports) == 1
    assert running_share(elsewhere, reports) == 1


def test_demand_within_the_deadband_keeps_what_is_placed():
    assert planned_demand(21, 20) == 20 and planned_demand(18, 20) == 20
    assert planned_demand(23, 20) == 23 and planned_demand(17, 20) == 17
    assert planned_demand(3, 2) == 3  # below ten replicas any change counts
    assert planned_demand(3, None) == 3 and planned_demand(3, 0) == 3


class _Cluster:
    """The fields of a cluster row that `reported_capacity` reads."""

    def __init__(self, generation: int, cap: PoolCapacity) -> None:
        self.state, self.desired_epoch, self.desired_generation = "healthy", 0, generation
        self.status = {"capacity": {"rsv": cap.model_dump(mode="json")}}


def test_replicas_waiting_under_an_older_plan_are_not_counted_against_the_new_one():
    """The plane counted one waiting replica of 3 at generation 4; generation 5 already
    moved it away. Counted again, it would cut the new plan's 2 to 1, then to 0 (flapping)."""
    waited = report(8, qwen=1).model_copy(update={"plan": (0, 4)})
    older = reported_capacity({"use1": _Cluster(5, waited)})  # type: ignore[dict-item]
    assert older["rsv"]["use1"].waiting_replicas == {}
    assert older["rsv"]["use1"].total_gpus == 8  # the plane's size still bounds the pool
    same = reported_capacity({"use1": _Cluster(4, waited)})  # type: ignore[dict-item]
    assert same["rsv"]["use1"].waiting_replicas == {"qwen": 1}
