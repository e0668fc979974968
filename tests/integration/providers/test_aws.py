"""AWS specifics the contract cannot see: what EC2 was actually asked for."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import PurchaseType, Throttled
from tests.fakes.ec2_shim import Ec2Shim
from tests.integration.providers.conftest import (
    aws_client,
    aws_harness,
    aws_reserved_harness,
    new_key,
)


def described(shim: Ec2Shim, instance_id: str) -> dict[str, Any]:
    reply = aws_client(shim, "ec2").describe_instances(InstanceIds=[instance_id])
    return reply["Reservations"][0]["Instances"][0]


def test_spot_pool_launches_spot_instances(
    aws_provider: Any, ec2_shim: Ec2Shim, interruption_queue: str
) -> None:
    harness = aws_harness(aws_provider, ec2_shim, interruption_queue)
    [instance] = aws_provider.create_instances(harness.make_pool(), 1, new_key())

    raw = described(ec2_shim, instance.id)

    assert raw["InstanceLifecycle"] == "spot"
    assert raw["Placement"]["AvailabilityZone"] == "us-east-1a"
    assert instance.purchase_type is PurchaseType.SPOT
    aws_provider.delete_instance(instance.id)


def test_reserved_pool_consumes_and_frees_reservation_slots(
    aws_provider: Any, ec2_shim: Ec2Shim
) -> None:
    harness = aws_reserved_harness(aws_provider, ec2_shim)
    pool = harness.make_pool()
    ec2 = aws_client(ec2_shim, "ec2")

    def available() -> int:
        reply = ec2.describe_capacity_reservations(
            CapacityReservationIds=[pool.capacity_reservation_id]
        )
        return reply["CapacityReservations"][0]["AvailableInstanceCount"]

    instances = aws_provider.create_instances(pool, 3, new_key())
    assert available() == 1
    assert {i.purchase_type for i in instances} == {PurchaseType.RESERVED}
    assert "InstanceLifecycle" not in described(ec2_shim, instances[0].id)

    aws_provider.delete_instance(instances[0].id)

    assert available() == 2
    for instance in instances[1:]:
        aws_provider.delete_instance(instance.id)


def test_offers_carry_gpu_info_zones_and_prices(aws_provider: Any) -> None:
    offers = {(o.instance_type, o.zone): o for o in aws_provider.offers()}

    p5 = offers[("p5.48xlarge", "us-east-1a")]
    assert (p5.gpu_type, p5.gpus_per_instance, p5.gpu_memory_mib) == ("H100-80G", 8, 81920)
    assert p5.on_demand_price == 98.32
    assert p5.spot_price is not None  # moto's spot history is synthetic (0.00001)
    l40s = offers[("g6e.xlarge", "us-east-1b")]
    assert (l40s.gpu_type, l40s.gpus_per_instance) == ("L40S", 1)


def test_a_throttled_launch_is_not_retried_by_botocore(
    aws_provider: Any, ec2_shim: Ec2Shim, interruption_queue: str
) -> None:
    """Procurement owns backoff: one call, one attempt; the next call goes through."""
    harness = aws_harness(aws_provider, ec2_shim, interruption_queue)
    pool, key = harness.make_pool(), new_key()
    calls = ec2_shim.run_instances_calls
    ec2_shim.inject("RunInstances", "RequestLimitExceeded", "Request limit exceeded.", 503)

    with pytest.raises(Throttled):
        aws_provider.create_instances(pool, 1, key)
    [instance] = aws_provider.create_instances(pool, 1, key)

    assert ec2_shim.run_instances_calls == calls + 1
    aws_provider.delete_instance(instance.id)


def test_a_key_retried_after_its_pool_changed_zone_returns_the_first_launch(
    aws_provider: Any, ec2_shim: Ec2Shim, interruption_queue: str
) -> None:
    """The first call's answer was lost; before the retry the offers refresh moved the pool to
    another zone. EC2 refuses the token with other parameters (IdempotentParameterMismatch):
    that was an InvalidRequest (the pool blocked 30 min, the instance billing unseen)."""
    from dataclasses import replace

    harness = aws_harness(aws_provider, ec2_shim, interruption_queue)
    pool, key = harness.make_pool(), new_key()
    [first] = aws_provider.create_instances(pool, 1, key)
    moved = replace(pool, zone="us-east-1b" if pool.zone != "us-east-1b" else "us-east-1a")
    again = aws_provider.create_instances(moved, 1, key)
    assert [i.id for i in again] == [first.id]
    aws_provider.delete_instance(first.id)
