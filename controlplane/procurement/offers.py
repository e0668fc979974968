"""The catalog side of procurement: what each provider offers for a pool's shape, at
what price, recorded in `pool.status` (`offer`; spot pools also `spot_price_per_gpu_hour`
and `spot_available_gpus`, which the placement loader reads). Runs in the caller's
transaction; no provider call.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.db.columns import pool_status, set_status
from controlplane.db.models import Pool
from providers.base import Offer
from providers.gpus import gpu_type as normalize_gpu


def record(session: Session, provider_id: str, offers: list[Offer], now: datetime) -> int:
    """The best matching offer of each of the provider's pools into `status.offer` (spot
    pools: their price per GPU-hour and what placement may plan to buy); returns the pools
    that have one."""
    at = now.isoformat()
    updated = 0
    for pool in session.scalars(select(Pool).where(Pool.provider_id == provider_id)):
        offer = _best_offer(pool, offers)
        if offer is None:
            set_status(pool, offer={"available": False, "refreshed_at": at})
            continue
        gpi = offer.gpus_per_instance
        spot = offer.spot_price / gpi if offer.spot_price is not None else None
        set_status(
            pool,
            offer={
                "instance_type": offer.instance_type,
                "zone": offer.zone,
                "on_demand_price": offer.on_demand_price,
                "spot_price": offer.spot_price,
                "available": offer.available,
                "refreshed_at": at,
            },
            spot_price_per_gpu_hour=spot if pool.purchase_type == "spot" else None,
            spot_available_gpus=_spot_room(pool, offer.available),
        )
        updated += 1
    return updated


def _spot_room(pool: Pool, available: bool) -> int | None:
    """What placement may plan to buy in a spot pool: the quota headroom (one instance
    without a quota) while the provider says the shape is available."""
    if pool.purchase_type != "spot":
        return None
    if not available:
        return 0
    held = pool_status(pool).held_gpus
    return max(0, pool.quota_gpus - held) if pool.quota_gpus is not None else pool.gpus_per_instance


def _best_offer(pool: Pool, offers: list[Offer]) -> Offer | None:
    def fits(o: Offer) -> bool:
        if o.region != pool.region.code or o.gpus_per_instance != pool.gpus_per_instance:
            return False
        if pool.instance_type:
            return o.instance_type == pool.instance_type
        return normalize_gpu(o.gpu_type) == normalize_gpu(pool.gpu_type.name)

    spot = pool.purchase_type == "spot"

    def price(o: Offer) -> float | None:
        return o.spot_price if spot else o.on_demand_price

    fitting = [o for o in offers if fits(o)]
    fitting.sort(key=lambda o: (not o.available, price(o) is None, price(o) or 0.0))
    return fitting[0] if fitting else None
