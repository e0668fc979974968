"""Each provider's error codes map to the typed error procurement branches on."""

from __future__ import annotations

import pytest

from providers import aws, gcp, lambda_cloud
from providers.base import (
    InsufficientCapacity,
    InvalidRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    Throttled,
)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("InsufficientInstanceCapacity", InsufficientCapacity),
        ("ReservationCapacityExceeded", InsufficientCapacity),
        ("InstanceLimitExceeded", QuotaExceeded),
        ("VcpuLimitExceeded", QuotaExceeded),
        ("MaxSpotInstanceCountExceeded", QuotaExceeded),
        ("RequestLimitExceeded", Throttled),
        ("Throttling", Throttled),
        ("InvalidInstanceID.NotFound", NotFound),
        ("InvalidInstanceID.Malformed", InvalidRequest),
        ("InvalidCapacityReservationId.NotFound", InvalidRequest),
        ("InvalidParameterValue", InvalidRequest),
        ("IdempotentParameterMismatch", InvalidRequest),
        ("InternalError", ProviderError),
    ],
)
def test_aws_codes(code: str, expected: type[ProviderError]) -> None:
    error = aws.error_for(code, "msg", "launching")
    assert type(error) is expected
    assert code in str(error)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", InsufficientCapacity),
        ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", InsufficientCapacity),
        ("QUOTA_EXCEEDED", QuotaExceeded),
        ("RATE_LIMIT_EXCEEDED", Throttled),
        ("RESOURCE_NOT_FOUND", NotFound),
        ("INVALID_USAGE", InvalidRequest),
        ("SOMETHING_NEW", ProviderError),
    ],
)
def test_gcp_operation_codes(code: str, expected: type[ProviderError]) -> None:
    assert type(gcp.error_for_operation(code, "msg", "creating")) is expected


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (400, "instance-operations/launch/insufficient-capacity", InsufficientCapacity),
        (400, "global/quota-exceeded", QuotaExceeded),
        (429, "", Throttled),
        (404, "global/object-does-not-exist", NotFound),
        (400, "global/invalid-parameters", InvalidRequest),
        (401, "global/invalid-api-key", ProviderError),
        (500, "global/unknown", ProviderError),
    ],
)
def test_lambda_codes(status: int, code: str, expected: type[ProviderError]) -> None:
    assert type(lambda_cloud.error_for(status, code, "msg", "launching")) is expected


def test_only_capacity_and_throttling_are_retryable() -> None:
    assert InsufficientCapacity.retryable and Throttled.retryable
    assert not (QuotaExceeded.retryable or InvalidRequest.retryable or NotFound.retryable)
