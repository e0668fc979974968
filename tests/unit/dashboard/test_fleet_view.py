"""What the Overview counts as held, allocated and free (pure parts of services.fleet_view)."""

from __future__ import annotations

from decimal import Decimal

from controlplane.db import models as m
from controlplane.services.fleet_view import PoolView, Totals, held_gpus


def pool(purchase_type: str, gpus: int, **kw: object) -> m.Pool:
    return m.Pool(name="p", purchase_type=purchase_type, gpus=gpus, **kw)


def test_a_reservation_is_held_for_its_commitment_whatever_is_used():
    assert held_gpus(pool("reserved", 16, committed_gpus=12)) == 12
    assert held_gpus(pool("reserved", 16)) == 16


def test_other_pools_hold_what_is_usable_or_what_procurement_bought():
    assert held_gpus(pool("on_demand", 8, status={})) == 8
    assert held_gpus(pool("on_demand", 0, status={"held_gpus": 16})) == 16
    assert held_gpus(pool("spot", 0, status=None)) == 0


def view(held: int, allocated: int, price: str = "2") -> PoolView:
    return PoolView("p", "aws", "r", "H100", "on_demand", held, held, allocated, Decimal(price),
                    None, None, None, None, None)  # fmt: skip


def test_free_never_goes_below_zero_and_cost_is_what_is_held():
    assert view(8, 10).free == 0
    assert view(8, 2).free == 6
    assert view(8, 2, "2.5").cost_per_hour == Decimal("20.0")
    assert view(0, 0).utilisation is None


def test_totals_add_up():
    t = Totals()
    for v in (view(8, 2), view(4, 4)):
        t.add(v)
    assert (t.held, t.allocated, t.free, t.cost_per_hour) == (12, 6, 6, Decimal(24))
