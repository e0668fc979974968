"""The world map: land outlines (world-atlas, TopoJSON) as one SVG path, and clusters placed
on it by their region's latitude/longitude. Equirectangular projection; pure functions."""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 960, 480


def project(longitude: float, latitude: float) -> tuple[float, float]:
    """(x, y) on the WIDTH×HEIGHT map for a point (degrees)."""
    x = (max(-180.0, min(180.0, longitude)) + 180.0) / 360.0 * WIDTH
    y = (90.0 - max(-90.0, min(90.0, latitude))) / 180.0 * HEIGHT
    return round(x, 1), round(y, 1)


def _arcs(topology: dict[str, Any]) -> list[list[tuple[float, float]]]:
    """Decode delta-encoded, quantised arcs into (longitude, latitude) points."""
    (sx, sy), (tx, ty) = topology["transform"]["scale"], topology["transform"]["translate"]
    out = []
    for arc in topology["arcs"]:
        x = y = 0
        points = []
        for dx, dy in arc:
            x, y = x + dx, y + dy
            points.append((x * sx + tx, y * sy + ty))
        out.append(points)
    return out


def _ring(arcs: list[list[tuple[float, float]]], indexes: list[int]) -> list[tuple[float, float]]:
    points: list[tuple[float, float]] = []
    for i in indexes:
        arc = arcs[i] if i >= 0 else arcs[~i][::-1]
        points.extend(arc[1:] if points else arc)
    return points


def land_path(topology: dict[str, Any]) -> str:
    """Every land polygon of the topology's `land` object as one SVG path `d`."""
    arcs = _arcs(topology)
    parts: list[str] = []
    for geometry in topology["objects"]["land"]["geometries"]:
        polygons = geometry["arcs"] if geometry["type"] == "MultiPolygon" else [geometry["arcs"]]
        for polygon in polygons:
            for ring in polygon:
                xy = [project(lon, lat) for lon, lat in _ring(arcs, ring)]
                if len(xy) > 2:
                    parts.append(_subpath(xy))
    return "".join(parts)


def _subpath(xy: list[tuple[float, float]]) -> str:
    """A ring as `M…L…Z`, lifting the pen where it crosses the antimeridian (a jump of more
    than half the map), which would otherwise draw a line across the whole world."""
    out = [f"M{xy[0][0]:g},{xy[0][1]:g}"]
    for (x0, _), (x, y) in itertools.pairwise(xy):
        out.append(("M" if abs(x - x0) > WIDTH / 2 else "L") + f"{x:g},{y:g}")
    return "".join(out) + "Z"


@cache
def land_path_from(path: Path) -> str:
    """The land path of a world-atlas file, read once per process; empty if it is missing."""
    if not path.is_file():
        return ""
    return land_path(json.loads(path.read_text()))


def marker_radius(gpus: int) -> float:
    """Area grows with GPUs: 6 px for none, 24 px at 1,000."""
    return round(min(6.0 + (max(gpus, 0) ** 0.5) * 0.6, 24.0), 1)
