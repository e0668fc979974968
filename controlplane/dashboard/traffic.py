"""Where the gateways' traffic goes, for the map: each gateway's own count of requests per plane
(`gpufleet_gateway_requests_total{plane=…}` on its /metrics) turned into lines gateway →
cluster whose width follows the plane's share. Pure: texts and coordinates in, drawing out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COUNTER = "gpufleet_gateway_requests"
MIN_WIDTH, MAX_WIDTH = 1.5, 12.0
GATEWAY_OFFSET = (0.0, 30.0)
"""A gateway is drawn this far (px) below its region's point, so that a cluster in the same
region stays visible and the line to it has a length."""


def gateway_point(region_xy: tuple[float, float]) -> tuple[float, float]:
    return region_xy[0] + GATEWAY_OFFSET[0], region_xy[1] + GATEWAY_OFFSET[1]


def arc(start: tuple[float, float], end: tuple[float, float]) -> str:
    """An SVG path `d` from start to end, bowed to the left by a fifth of its length (so lines
    from two gateways to one cluster do not lie on each other)."""
    (x0, y0), (x1, y1) = start, end
    cx, cy = (x0 + x1) / 2 - (y1 - y0) / 5, (y0 + y1) / 2 + (x1 - x0) / 5
    return f"M{x0:g},{y0:g}Q{round(cx, 1):g},{round(cy, 1):g} {x1:g},{y1:g}"


def requests_by_plane(text: str) -> dict[str, float]:
    """Plane (cluster) → requests the gateway sent there, every status; requests refused before
    reaching a plane (no plane label) are left out."""
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if family.name != COUNTER:
            continue
        for s in family.samples:
            if s.name == f"{COUNTER}_total" and s.labels.get("plane"):
                out[s.labels["plane"]] += s.value
    return dict(out)


@dataclass(frozen=True)
class Flow:
    plane: str
    requests: int
    share: float
    """of this gateway's requests that reached a plane, 0–1"""
    width: float
    """stroke width (px), MIN_WIDTH … MAX_WIDTH by share"""
    start: tuple[float, float]
    end: tuple[float, float]
    path: str
    """SVG path `d`: the arc from start to end"""


def flows(
    start: tuple[float, float],
    counts: Mapping[str, float],
    planes: Mapping[str, tuple[float, float]],
) -> list[Flow]:
    """One line per plane the gateway sent requests to, widest first; a plane not on the map
    (unknown to the control plane) is left out, but its requests still count in the shares."""
    total = sum(v for v in counts.values() if v > 0)
    if total <= 0:
        return []
    out = [
        Flow(
            plane=plane,
            requests=int(n),
            share=round(n / total, 3),
            width=round(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * n / total, 1),
            start=start,
            end=planes[plane],
            path=arc(start, planes[plane]),
        )
        for plane, n in counts.items()
        if n > 0 and plane in planes
    ]
    return sorted(out, key=lambda f: (-f.requests, f.plane))
