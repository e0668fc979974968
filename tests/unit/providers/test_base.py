"""Plain-data rules: pool references, idempotency keys, GPU names, names carrying keys."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from providers.aws import notice_from_event
from providers.base import InvalidRequest, PoolRef, PurchaseType, check_idempotency_key
from providers.gpus import gpu_type
from providers.lambda_cloud import instance_name, key_of
from providers.registry import FACTORIES, create_provider


def make_pool(**changes: object) -> PoolRef:
    fields: dict[str, object] = {
        "name": "h100-use1",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "gpu_type": "H100-80G",
        "instance_type": "p5.48xlarge",
        "purchase_type": PurchaseType.ON_DEMAND,
        "gpus_per_instance": 8,
    }
    return PoolRef(**{**fields, **changes})  # type: ignore[arg-type]


def test_reserved_pool_needs_its_reservation_and_others_must_not_have_one() -> None:
    assert make_pool(purchase_type=PurchaseType.RESERVED, capacity_reservation_id="cr-1")
    with pytest.raises(InvalidRequest, match="no capacity_reservation_id"):
        make_pool(purchase_type=PurchaseType.RESERVED)
    with pytest.raises(InvalidRequest, match="drop it"):
        make_pool(capacity_reservation_id="cr-1")
    with pytest.raises(InvalidRequest, match="gpus_per_instance"):
        make_pool(gpus_per_instance=0)


@given(st.uuids())
def test_every_uuid_is_a_portable_idempotency_key(value: uuid.UUID) -> None:
    assert check_idempotency_key(str(value)) == str(value)


@pytest.mark.parametrize("key", ["", "Upper", "with space", "-lead", "a" * 41, "ü"])
def test_unportable_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidRequest, match="uuid"):
        check_idempotency_key(key)


@given(st.uuids(), st.integers(min_value=0, max_value=999))
def test_lambda_names_carry_the_key_back(value: uuid.UUID, index: int) -> None:
    name = instance_name(str(value), index)
    assert len(name) <= 64
    assert key_of(name) == str(value)


def test_names_not_made_by_gpufleet_carry_no_key() -> None:
    assert key_of("training-node-1") is None and key_of(None) is None and key_of("gf-x") is None


@pytest.mark.parametrize(
    ("spelling", "memory_mib", "expected"),
    [
        ("H100", 81920, "H100-80G"),
        ("nvidia-h100-80gb", None, "H100-80G"),
        ("H100 (80 GB SXM5)", None, "H100-80G"),
        ("nvidia-tesla-a100", None, "A100-40G"),
        ("nvidia-a100-80gb", None, "A100-80G"),
        ("A100", 40960, "A100-40G"),
        ("L40S", 45776, "L40S"),
        ("nvidia-l4", None, "L4"),
        ("nvidia-h200-141gb", None, "H200"),
        ("GH200 (96 GB)", None, "GH200"),
        ("nvidia-b200", None, "B200"),
        ("Radeon Pro V520", None, "RADEON PRO V520"),
    ],
)
def test_gpu_spellings_become_one_vocabulary(
    spelling: str, memory_mib: int | None, expected: str
) -> None:
    assert gpu_type(spelling, memory_mib) == expected


def test_spot_warning_event_gives_a_two_minute_deadline() -> None:
    sent = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    event = {
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "time": "2026-03-01T12:00:00Z",
        "detail": {"instance-id": "i-0abc", "instance-action": "terminate"},
    }

    notice = notice_from_event(json.dumps(event))

    assert notice is not None
    assert (notice.instance_id, notice.deadline) == ("i-0abc", sent + timedelta(minutes=2))
    rebalance = {**event, "detail-type": "EC2 Instance Rebalance Recommendation"}
    assert notice_from_event(json.dumps(rebalance)) is None
    assert notice_from_event("not json") is None


def test_registry_names_every_adapter_and_refuses_unknown_kinds() -> None:
    assert sorted(FACTORIES) == ["aws", "gcp", "lambda", "local"]
    assert create_provider("local", gpus_total=2).kind == "local"
    with pytest.raises(InvalidRequest, match="use one of: aws, gcp, lambda, local"):
        create_provider("azure")
