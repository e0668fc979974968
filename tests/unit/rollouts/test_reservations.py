"""GPUs held out of placement for rollout lanes and shadows (`services.reservations`):
pure, no database."""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane import placement as engine
from controlplane import rollouts as ro
from controlplane.contracts import RevisionSpec
from controlplane.services.lanes import Canary
from controlplane.services.reservations import Reserved, reservations, reserve
from controlplane.specs import ShadowSpec

T0 = datetime(2026, 12, 1, tzinfo=UTC)
STABLE = RevisionSpec(model_id="m", revision="1", engine_image="vllm:old", gpus_per_replica=2)
PLACED = (
    engine.Assignment("chat", "a", "rsv", 2),
    engine.Assignment("chat", "a", "od", 5),
    engine.Assignment("chat", "b", "od", 1),
    engine.Assignment("other", "a", "od", 3),
)


def _green() -> dict[str, Canary]:
    return {"chat": Canary("chat--r2", STABLE, ro.start(T0), ro.blue_green(600))}


def test_a_blue_green_copy_is_held_per_cluster_on_its_largest_pool():
    got = reservations(PLACED, {"chat": 2, "other": 1}, _green(), {})
    assert got == [  # 7 and 1 replicas of the stable shape (2 GPUs) beside the new copy
        Reserved("chat", "a", "od", 14, "rollout chat--r2 (blue_green)"),
        Reserved("chat", "b", "od", 2, "rollout chat--r2 (blue_green)"),
    ]


def test_a_shadow_is_held_on_every_cluster_of_the_deployment():
    shadow = ShadowSpec(share=0.1, replicas=2)
    got = reservations(PLACED, {"chat": 1, "other": 1}, {}, {"other": shadow})
    assert got == [Reserved("other", "a", "od", 2, "shadow")]


def _pool(capacity: int, procurable: int) -> engine.Pool:
    return engine.Pool(
        id="od", provider="aws", region="r", gpu_type="H100", purchase="on_demand",
        capacity_gpus=capacity, price_per_gpu_hour=3.0, procurable_gpus=procurable,
    )  # fmt: skip


def _input(capacity: int, procurable: int, used: int = 0) -> engine.PlacementInput:
    return engine.PlacementInput(
        regions=(),
        pools=(_pool(capacity, procurable),),
        clusters=(),
        deployments=(engine.Deployment("other", 1, ("H100",), used),),
        current=(engine.Assignment("other", "a", "od", used),) if used else (),
    )


def _reserved(capacity: int, procurable: int, gpus: int, used: int = 0) -> tuple[int, int, int]:
    """(capacity, procurable) left to the engine, and the GPUs held."""
    wanted = [Reserved("chat", "a", "od", gpus, "shadow")]
    inp, held = reserve(_input(capacity, procurable, used), wanted)
    (pool,) = inp.pools
    return pool.capacity_gpus, pool.procurable_gpus, sum(r.gpus for r in held)


def test_reserved_gpus_leave_the_free_capacity_then_what_can_be_procured():
    assert _reserved(10, 6, 4) == (6, 6, 4)
    assert _reserved(10, 6, 14) == (0, 2, 14)  # 4 beyond the capacity must be bought
    assert _reserved(10, 6, 30) == (0, 0, 16)  # the rest waits
    inp = _input(10, 6)
    assert reserve(inp, []) == (inp, [])


def test_a_reservation_never_takes_the_gpus_of_placed_replicas():
    assert _reserved(10, 0, 4, used=8) == (8, 0, 2)  # 2 free: the lane waits for the rest
    assert _reserved(10, 0, 4, used=10) == (10, 0, 0)
    assert _reserved(10, 3, 4, used=10) == (10, 0, 3)  # bought instead
