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
    Unavailable,
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
        ("InternalError", Unavailable),  # may have launched: the same key again, no block
        ("ServiceUnavailable", Unavailable),
        ("SomethingNew", ProviderError),
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
        (500, "global/unknown", Unavailable),
        (418, "global/unknown", ProviderError),
    ],
)
def test_lambda_codes(status: int, code: str, expected: type[ProviderError]) -> None:
    assert type(lambda_cloud.error_for(status, code, "msg", "launching")) is expected


def test_only_capacity_throttling_and_no_answer_are_retryable() -> None:
    assert InsufficientCapacity.retryable and Throttled.retryable and Unavailable.retryable
    assert not (QuotaExceeded.retryable or InvalidRequest.retryable or NotFound.retryable)


def test_no_answer_from_a_provider_is_unavailable_not_a_refusal() -> None:
    """A timeout or a dropped connection says nothing about the pool: blocking it for 30
    minutes and giving up its key (so that the next plan buys again) was wrong on both
    counts; procurement retries the same key."""
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
    from google.api_core import exceptions as gexc

    timeout = ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")
    assert type(aws._translate(timeout, "launching")) is Unavailable
    refused = EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")
    assert type(aws._translate(refused, "launching")) is Unavailable
    for server in (gexc.InternalServerError("boom"), gexc.ServiceUnavailable("later")):
        assert type(gcp.error_for_http(server, "creating")) is Unavailable
    assert type(gcp.error_for_http(gexc.Forbidden("no"), "creating")) is ProviderError
