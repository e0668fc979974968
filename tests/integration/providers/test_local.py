"""local specifics: state shared through the file, interruption only for spot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from providers.base import InsufficientCapacity, InvalidRequest, PoolRef, PurchaseType
from providers.local import LocalProvider


def pool(purchase: PurchaseType = PurchaseType.ON_DEMAND, gpus: int = 2) -> PoolRef:
    return PoolRef("local", "local", None, "L4", f"local-{gpus}gpu", purchase, gpus)


def test_two_processes_share_one_machine(tmp_path: Path) -> None:
    one = LocalProvider(gpus_total=4, state_path=tmp_path / "s.json")
    other = LocalProvider(gpus_total=4, state_path=tmp_path / "s.json")

    [held] = one.create_instances(pool(), 1, "key-1")

    assert [i.id for i in other.list_instances()] == [held.id]
    assert other.create_instances(pool(), 1, "key-1") == [held]
    with pytest.raises(InsufficientCapacity, match="2 free of 4"):
        other.create_instances(pool(gpus=4), 1, "key-2")
    other.delete_instance(held.id)
    assert one.list_instances() == []


def test_interruption_deadline_comes_from_the_injected_clock() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    provider = LocalProvider(clock=lambda: now)
    [spot] = provider.create_instances(pool(PurchaseType.SPOT), 1, "key-spot")
    [steady] = provider.create_instances(pool(), 1, "key-steady")

    provider.interrupt(spot.id, timedelta(seconds=30))

    [notice] = provider.interruption_notices()
    assert (notice.instance_id, notice.deadline) == (spot.id, now + timedelta(seconds=30))
    with pytest.raises(InvalidRequest, match="not spot"):
        provider.interrupt(steady.id)
