from __future__ import annotations

from pathlib import Path

from tests.unit.workloadplane.builders import make_deployment, make_desired
from workloadplane.state import DesiredStateStore, should_apply


def test_save_then_load_round_trips(tmp_path: Path):
    store = DesiredStateStore(tmp_path / "state")
    assert store.load() is None
    state = make_desired(7, make_deployment())
    store.save(state)
    store.sync()
    assert DesiredStateStore(tmp_path / "state").load() == state
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["desired-state.json"]


def test_save_replaces_atomically(tmp_path: Path):
    store = DesiredStateStore(tmp_path)
    store.save(make_desired(1))
    store.save(make_desired(2, make_deployment()))
    loaded = store.load()
    assert loaded is not None
    assert loaded.generation == 2
    assert not list(tmp_path.glob(".desired-*"))  # no temp files left behind


def test_unreadable_file_is_ignored_not_fatal(tmp_path: Path):
    store = DesiredStateStore(tmp_path)
    store.path.write_text('{"schema_version": 1, "half": ')
    assert store.load() is None


def test_only_newer_generations_for_this_cluster_apply():
    g2 = make_desired(2)
    assert should_apply(None, g2, "a")
    assert should_apply(g2, make_desired(3), "a")
    assert not should_apply(g2, make_desired(2), "a")
    assert not should_apply(g2, make_desired(1), "a")
    assert not should_apply(None, make_desired(9, cluster="b"), "a")
