from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.workloadplane.builders import make_deployment, make_desired
from workloadplane.state import (
    SLOT_FILES,
    STATE_FILE,
    DesiredStateStore,
    StateDirInUseError,
    frame,
    lock_state_dir,
    should_apply,
    unframe,
)


def test_save_then_load_round_trips(tmp_path: Path):
    store = DesiredStateStore(tmp_path / "state")
    assert store.load() is None
    state = make_desired(7, make_deployment())
    store.save(state)
    store.sync()
    assert DesiredStateStore(tmp_path / "state").load() == state
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == list(SLOT_FILES)


def test_saves_alternate_slots_and_the_newest_wins(tmp_path: Path):
    store = DesiredStateStore(tmp_path)
    for generation in (1, 2, 3):
        store.save(make_desired(generation, make_deployment(min_=generation)))
    reloaded = DesiredStateStore(tmp_path)
    loaded = reloaded.load()
    assert loaded is not None and loaded.generation == 3
    # after a restart the next save goes to the other slot: generation 3 stays on disk
    reloaded.save(make_desired(4))
    assert DesiredStateStore(tmp_path).load().generation == 4  # type: ignore[union-attr]
    for slot in SLOT_FILES:  # lose the slot holding 4: 3 is what is left
        data = (tmp_path / slot).read_bytes()
        if unframe(data) is not None and b'"generation":4' in data:
            (tmp_path / slot).write_bytes(b"")
    assert DesiredStateStore(tmp_path).load().generation == 3  # type: ignore[union-attr]


def test_a_torn_write_falls_back_to_the_previous_snapshot(tmp_path: Path):
    """Power lost in the middle of a write: the slot's CRC does not match; the other slot
    still holds the snapshot before it."""
    store = DesiredStateStore(tmp_path)
    store.save(make_desired(1, make_deployment(min_=1)))
    store.save(make_desired(2, make_deployment(min_=2)))
    newest = tmp_path / SLOT_FILES[1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # torn
    loaded = DesiredStateStore(tmp_path).load()
    assert loaded is not None and loaded.generation == 1
    flipped = bytearray(data)
    flipped[-3] ^= 0x01  # a bit flipped: same length, wrong CRC
    newest.write_bytes(bytes(flipped))
    loaded = DesiredStateStore(tmp_path).load()
    assert loaded is not None and loaded.generation == 1


def test_a_shorter_snapshot_over_a_longer_one_reads_back_exactly(tmp_path: Path):
    store = DesiredStateStore(tmp_path)
    big = make_desired(1, *(make_deployment(f"d{i}") for i in range(20)))
    store.save(big)
    store.save(make_desired(2, make_deployment()))
    store.save(small := make_desired(3))  # over the big one's slot: trailing bytes ignored
    assert DesiredStateStore(tmp_path).load() == small


def test_an_older_agents_file_is_read_and_unreadable_files_are_ignored(tmp_path: Path):
    legacy = make_desired(5, make_deployment())
    (tmp_path / STATE_FILE).write_text(legacy.model_dump_json())
    assert DesiredStateStore(tmp_path).load() == legacy
    (tmp_path / STATE_FILE).write_text('{"schema_version": 1, "half": ')
    (tmp_path / SLOT_FILES[0]).write_bytes(frame(b'{"not": "a desired state"}'))
    assert DesiredStateStore(tmp_path).load() is None
    assert unframe(b"garbage") is None and unframe(frame(b"ok")) == b"ok"


def test_only_newer_generations_for_this_cluster_apply():
    g2 = make_desired(2)
    assert should_apply(None, g2, "a")
    assert should_apply(g2, make_desired(3), "a")
    assert not should_apply(g2, make_desired(2), "a")
    assert not should_apply(g2, make_desired(1), "a")
    assert not should_apply(None, make_desired(9, cluster="b"), "a")


def test_a_snapshot_of_another_cluster_in_the_folder_is_not_loaded(tmp_path: Path):
    """Cluster b's newer file copied into a's folder: a would start b's deployments and
    acknowledge b's generation as its own."""
    DesiredStateStore(tmp_path / "b").save(make_desired(50, make_deployment(), cluster="b"))
    store = DesiredStateStore(tmp_path / "a")
    store.save(make_desired(3, cluster="a"))
    for slot in SLOT_FILES:  # b's slot where a keeps its other one
        if not (tmp_path / "a" / slot).exists() or (tmp_path / "a" / slot).stat().st_size == 0:
            (tmp_path / "a" / slot).write_bytes((tmp_path / "b" / SLOT_FILES[0]).read_bytes())
    loaded = DesiredStateStore(tmp_path / "a").load("a")
    assert loaded is not None and (loaded.cluster, loaded.generation) == ("a", 3)
    assert DesiredStateStore(tmp_path / "a").load().generation == 50  # type: ignore[union-attr]


def test_one_agent_per_state_folder(tmp_path: Path):
    held = lock_state_dir(tmp_path)
    try:
        with pytest.raises(StateDirInUseError, match=f"pid {os.getpid()}"):
            lock_state_dir(tmp_path)
    finally:
        held.close()
    lock_state_dir(tmp_path).close()  # released with its holder
