"""Cost model: what one GPU-hour of a deployment costs in a pool, as the engine sees it.

effective $/GPU-hour = marginal price + latency term, where the marginal price is
  reserved:  price x reserved_price_factor (already paid; 0 by default, so reserved fills first)
  spot:      price x (1 + interruptions per hour x GPU-hours lost per interruption)
  on_demand: price
and the latency term is latency_cost_per_ms x the traffic-weighted one-way latency from the
regions the deployment's traffic comes from (ms_per_time_zone per time zone crossed).
Pure functions over numpy arrays; no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from controlplane.placement.model import CostWeights, Pool


def marginal_price(pool: Pool, weights: CostWeights) -> float:
    """The pool's $/GPU-hour as the objective counts it (see the module docstring)."""
    if pool.purchase == "reserved":
        return pool.price_per_gpu_hour * weights.reserved_price_factor
    if pool.purchase == "spot":
        loss = pool.interruption_rate_per_hour * weights.spot_interruption_loss_hours
        return pool.price_per_gpu_hour * (1.0 + loss)
    return pool.price_per_gpu_hour


def time_zone_distance(a: np.ndarray, b: float) -> np.ndarray:
    """Time zones between UTC offsets, the short way round the globe."""
    d = np.abs(a - b) % 24.0
    return np.minimum(d, 24.0 - d)


def latency_by_region(
    traffic: Mapping[str, float],
    region_index: Mapping[str, int],
    region_offsets: np.ndarray,
    weights: CostWeights,
) -> np.ndarray:
    """Traffic-weighted one-way latency (ms) to each region; zeros when traffic is unknown."""
    total = sum(w for w in traffic.values() if w > 0)
    latency = np.zeros(len(region_offsets))
    if total <= 0:
        return latency
    for region, w in sorted(traffic.items()):
        if w > 0 and region in region_index:
            src = float(region_offsets[region_index[region]])
            latency += (w / total) * time_zone_distance(region_offsets, src)
    return latency * weights.ms_per_time_zone


def cost_row(
    unit_cost: np.ndarray,
    pool_region: np.ndarray,
    latency: np.ndarray,
    weights: CostWeights,
) -> np.ndarray:
    """Effective $/GPU-hour of each pool for one deployment (latency already per region)."""
    return unit_cost + weights.latency_cost_per_ms * latency[pool_region]


def list_cost(prices: Sequence[float], gpus: Sequence[int]) -> float:
    """Cost at list price (what the bill says), reserved included."""
    return float(sum(p * g for p, g in zip(prices, gpus, strict=True)))
