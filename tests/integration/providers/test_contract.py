"""One provider contract, run against every adapter through its real client library and a
local server (see conftest.py): what procurement relies on, whatever the cloud."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from providers.base import InstanceState, InvalidRequest, Provider, PurchaseType
from tests.integration.providers.conftest import Harness, build_harness, new_key

ERROR_CASES = {
    "aws": [
        "InsufficientInstanceCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "RequestLimitExceeded",
        "IdempotentParameterMismatch",
        "InvalidInstanceType",
    ],
    "aws-reserved": ["ReservationCapacityExceeded", "InvalidCapacityReservationId"],
    "gcp": [
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "QUOTA_EXCEEDED-operation",
        "403-quotaExceeded",
        "429-rateLimitExceeded",
        "400-invalid",
        "unknown-gpu-type",
    ],
    "lambda": ["insufficient-capacity", "quota-exceeded", "429", "invalid-parameters", "spot-pool"],
    "local": ["max-instances", "out-of-gpus", "bad-key"],
}


def held(provider: Provider, key: str) -> list[str]:
    return sorted(i.id for i in provider.list_instances() if i.idempotency_key == key)


def test_adapter_satisfies_the_protocol(harness: Harness) -> None:
    assert isinstance(harness.provider, Provider)


def test_offers_are_plain_data_with_gpus_and_prices(harness: Harness) -> None:
    offers = harness.provider.offers()

    assert offers, "an account with GPU shapes must offer something"
    for offer in offers:
        assert offer.provider == harness.provider.kind
        assert offer.gpus_per_instance >= 1 and offer.gpu_type
        assert offer.on_demand_price is None or offer.on_demand_price >= 0
        assert offer.spot_price is None or offer.spot_price >= 0
    assert any(o.on_demand_price is not None or o.spot_price is not None for o in offers), (
        "some offer carries a price"
    )


def test_create_list_delete(harness: Harness) -> None:
    provider, pool, key = harness.provider, harness.make_pool(), new_key()

    created = provider.create_instances(pool, 2, key)

    assert len(created) == 2 and len({i.id for i in created}) == 2
    for instance in created:
        assert instance.idempotency_key == key
        assert instance.pool in (pool.name, None)
        assert instance.gpus == pool.gpus_per_instance
        assert instance.purchase_type in (pool.purchase_type, None)
        assert instance.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert held(provider, key) == sorted(i.id for i in created)

    provider.delete_instance(created[0].id)

    assert held(provider, key) == [created[1].id]
    provider.delete_instance(created[1].id)
    assert held(provider, key) == []


def test_delete_twice_and_delete_unknown_are_silent(harness: Harness) -> None:
    provider = harness.provider
    [instance] = provider.create_instances(harness.make_pool(), 1, new_key())

    provider.delete_instance(instance.id)
    provider.delete_instance(instance.id)
    provider.delete_instance(harness.unknown_id)

    assert instance.id not in {i.id for i in provider.list_instances()}


def test_same_idempotency_key_twice_launches_once(harness: Harness) -> None:
    provider, pool, key = harness.provider, harness.make_pool(), new_key()

    first = provider.create_instances(pool, 2, key)
    again = provider.create_instances(pool, 2, key)

    assert sorted(i.id for i in again) == sorted(i.id for i in first)
    assert held(provider, key) == sorted(i.id for i in first)
    for instance in first:
        provider.delete_instance(instance.id)


def test_bad_arguments_are_invalid_requests(harness: Harness) -> None:
    with pytest.raises(InvalidRequest, match="idempotency key"):
        harness.provider.create_instances(harness.make_pool(), 1, "UPPER_and spaces")
    with pytest.raises(InvalidRequest, match="count"):
        harness.provider.create_instances(harness.make_pool(), 0, new_key())


@pytest.mark.parametrize(
    ("kind", "label"), [(kind, label) for kind, labels in ERROR_CASES.items() for label in labels]
)
def test_provider_error_is_raised_typed(request: pytest.FixtureRequest, kind: str, label: str):
    harness = build_harness(request, kind)
    case = harness.errors[label]()
    try:
        case.arrange()
        with pytest.raises(case.expected) as raised:
            case.act()
    finally:
        harness.clear_faults()

    assert type(raised.value) is case.expected
    assert "; " in str(raised.value), "the message says what to change"


def test_every_error_case_is_listed(request: pytest.FixtureRequest) -> None:
    for kind, labels in ERROR_CASES.items():
        assert sorted(build_harness(request, kind).errors) == sorted(labels)


def test_spot_interruption_is_noticed(harness: Harness) -> None:
    provider = harness.provider
    if harness.interrupt is None:
        assert provider.interruption_notices() == []
        return
    pool = harness.make_pool()
    assert pool.purchase_type is PurchaseType.SPOT
    [doomed, spared] = provider.create_instances(pool, 2, new_key())
    before = datetime.now(UTC)

    harness.interrupt(doomed)
    notices = provider.interruption_notices()

    assert [n.instance_id for n in notices if n.instance_id in (doomed.id, spared.id)] == [
        doomed.id
    ]
    [notice] = [n for n in notices if n.instance_id == doomed.id]
    assert before - timedelta(seconds=5) < notice.deadline <= before + timedelta(minutes=3)

    provider.delete_instance(doomed.id)
    provider.delete_instance(spared.id)
    assert doomed.id not in {n.instance_id for n in provider.interruption_notices()}
