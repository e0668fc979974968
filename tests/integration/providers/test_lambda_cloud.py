"""Lambda specifics: list-before-launch idempotency and regional availability."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import InsufficientCapacity, PoolRef, PurchaseType
from tests.fakes.lambda_cloud import FakeLambdaCloud
from tests.integration.providers.conftest import new_key


def make_pool() -> PoolRef:
    return PoolRef(f"lambda-{new_key()[:8]}", "us-east-1", None, "H100-80G", "gpu_1x_h100_pcie",
                   PurchaseType.ON_DEMAND, 1)  # fmt: skip


def test_a_failed_launch_midway_is_completed_without_duplicates(
    lambda_provider: Any, fake_lambda: FakeLambdaCloud
) -> None:
    pool, key = make_pool(), new_key()
    launches = fake_lambda.launches
    lambda_provider.create_instances(pool, 1, key)
    fake_lambda.inject(
        400, "instance-operations/launch/insufficient-capacity", "Not enough capacity"
    )

    with pytest.raises(InsufficientCapacity):
        lambda_provider.create_instances(pool, 3, key)
    done = lambda_provider.create_instances(pool, 3, key)

    assert len({i.id for i in done}) == 3
    assert len([i for i in lambda_provider.list_instances() if i.idempotency_key == key]) == 3
    assert fake_lambda.launches - launches == 4  # 1 + 1 refused + 2 missing
    for instance in done:
        lambda_provider.delete_instance(instance.id)


def test_offers_show_prices_and_where_capacity_is(
    lambda_provider: Any, fake_lambda: FakeLambdaCloud
) -> None:
    fake_lambda.capacity[("gpu_1x_a10", "us-west-1")] = 0

    offers = {(o.instance_type, o.region): o for o in lambda_provider.offers()}

    h100 = offers[("gpu_8x_h100_sxm5", "us-east-1")]
    assert (h100.gpu_type, h100.gpus_per_instance, h100.on_demand_price) == ("H100-80G", 8, 23.92)
    assert offers[("gpu_1x_a10", "us-east-1")].available
    assert not offers[("gpu_1x_a10", "us-west-1")].available
    assert not offers[("gpu_1x_a10", "us-south-1")].available  # no capacity reported there
