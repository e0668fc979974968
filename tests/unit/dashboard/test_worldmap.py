"""The world map's projection and TopoJSON decoding (pure)."""

from __future__ import annotations

from controlplane.dashboard import worldmap
from controlplane.dashboard.assets import WORLD


def test_the_projection_puts_the_corners_and_the_origin_where_they_belong():
    assert worldmap.project(-180, 90) == (0, 0)
    assert worldmap.project(180, -90) == (worldmap.WIDTH, worldmap.HEIGHT)
    assert worldmap.project(0, 0) == (worldmap.WIDTH / 2, worldmap.HEIGHT / 2)
    assert worldmap.project(500, -500) == (worldmap.WIDTH, worldmap.HEIGHT)  # clamped


def test_a_topology_decodes_delta_encoded_arcs_and_reversed_ones():
    square = {
        "transform": {"scale": [1, 1], "translate": [0, 0]},
        "arcs": [[[0, 0], [10, 0], [0, 10]], [[10, 10], [-10, 0], [0, -10]]],
        "objects": {"land": {"geometries": [{"type": "Polygon", "arcs": [[0, 1]]}]}},
    }
    d = worldmap.land_path(square)
    assert d.startswith("M480,240L")
    assert d.endswith("Z") and d.count("M") == 1
    reversed_arc = square | {
        "objects": {"land": {"geometries": [{"type": "Polygon", "arcs": [[~1, ~0]]}]}}
    }
    assert worldmap.land_path(reversed_arc).count("L") == d.count("L")


def test_a_ring_across_the_antimeridian_lifts_the_pen_instead_of_crossing_the_map():
    ring = [(950.0, 100.0), (5.0, 101.0), (10.0, 110.0)]
    assert worldmap._subpath(ring) == "M950,100M5,101L10,110Z"


def test_bigger_clusters_get_bigger_markers_within_bounds():
    assert worldmap.marker_radius(0) == 6
    assert worldmap.marker_radius(16) < worldmap.marker_radius(64)
    assert worldmap.marker_radius(10**9) == 24


def test_the_vendored_land_file_draws_the_whole_world():
    d = worldmap.land_path_from(WORLD)
    assert d.count("M") > 100  # 110m land has well over a hundred rings
