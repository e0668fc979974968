"""GCP specifics: the instance resource GCE receives, and request-id / name idempotency."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import InsufficientCapacity, PoolRef, PurchaseType
from tests.fakes.gce import FakeGce
from tests.integration.providers.conftest import GCP_PROJECT, GCP_ZONE, new_key


def sent(fake: FakeGce, instance_id: str) -> dict[str, Any]:
    zone, name = instance_id.split("/")
    return fake.instances[(GCP_PROJECT, zone, name)]


def pool(purchase: PurchaseType, reservation: str | None = None) -> PoolRef:
    return PoolRef(
        f"gcp-{purchase}-{new_key()[:8]}", "us-central1", GCP_ZONE, "H100-80G", "a3-highgpu-8g",
        purchase, 8, capacity_reservation_id=reservation,
    )  # fmt: skip


def test_spot_instances_ask_for_spot_with_accelerators(gcp_provider: Any, fake_gce: FakeGce):
    [instance] = gcp_provider.create_instances(pool(PurchaseType.SPOT), 1, new_key())

    body = sent(fake_gce, instance.id)

    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": f"zones/{GCP_ZONE}/acceleratorTypes/nvidia-h100-80gb",
            "acceleratorCount": 8,
        }
    ]
    assert instance.gpus == 8
    gcp_provider.delete_instance(instance.id)


def test_reserved_instances_target_their_reservation(gcp_provider: Any, fake_gce: FakeGce):
    reserved = pool(PurchaseType.RESERVED, reservation="h100-commit-2026")
    [instance] = gcp_provider.create_instances(reserved, 1, new_key())

    body = sent(fake_gce, instance.id)

    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert body["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["h100-commit-2026"],
    }
    gcp_provider.delete_instance(instance.id)


def test_a_repeat_with_the_same_key_meets_the_named_instances(
    gcp_provider: Any, fake_gce: FakeGce
) -> None:
    spot, key = pool(PurchaseType.SPOT), new_key()
    first = gcp_provider.create_instances(spot, 2, key)
    inserts = fake_gce.inserts

    again = gcp_provider.create_instances(spot, 2, key)

    assert [i.id for i in again] == [i.id for i in first]
    assert fake_gce.inserts == inserts  # found by their key: nothing inserted again
    mine = [i for i in gcp_provider.list_instances() if i.idempotency_key == key]
    assert len(mine) == 2
    for instance in first:
        gcp_provider.delete_instance(instance.id)


def test_a_stockout_midway_is_completed_by_a_retry(gcp_provider: Any, fake_gce: FakeGce):
    spot, key = pool(PurchaseType.SPOT), new_key()
    gcp_provider.create_instances(spot, 1, key)  # instance 0 exists from an earlier try
    fake_gce.inject_operation("ZONE_RESOURCE_POOL_EXHAUSTED", "not enough resources")

    with pytest.raises(InsufficientCapacity):
        gcp_provider.create_instances(spot, 3, key)
    done = gcp_provider.create_instances(spot, 3, key)

    assert [i.id.rsplit("-", 1)[1] for i in done] == ["0", "1", "2"]
    assert len([i for i in gcp_provider.list_instances() if i.idempotency_key == key]) == 3
    for instance in done:
        gcp_provider.delete_instance(instance.id)


def test_a_key_retried_after_its_pool_changed_zone_meets_its_first_instance(
    gcp_provider: Any, fake_gce: FakeGce
) -> None:
    """Names are unique per zone only: a retry after the offers refresh moved the pool made a
    second gf-<key>-0 in the other zone, which nothing adopted or deleted."""
    from dataclasses import replace

    spot, key = pool(PurchaseType.SPOT), new_key()
    [first] = gcp_provider.create_instances(spot, 1, key)
    again = gcp_provider.create_instances(replace(spot, zone="us-central1-b"), 1, key)
    assert [i.id for i in again] == [first.id]
    assert len([i for i in gcp_provider.list_instances() if i.idempotency_key == key]) == 1
    gcp_provider.delete_instance(first.id)
