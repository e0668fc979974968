"""Provider kinds → factories. An explicit dict: adding a provider means adding a line here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from providers.base import InvalidRequest, Provider


def _aws(**config: Any) -> Provider:
    from providers.aws import AwsProvider

    return AwsProvider(**config)


def _gcp(**config: Any) -> Provider:
    from providers.gcp import GcpProvider

    return GcpProvider(**config)


def _lambda(**config: Any) -> Provider:
    from providers.lambda_cloud import LambdaProvider

    return LambdaProvider(**config)


def _local(**config: Any) -> Provider:
    from providers.local import LocalProvider

    return LocalProvider(**config)


# Imports are deferred so that `local` does not pay for boto3 / google-cloud-compute.
FACTORIES: Mapping[str, Callable[..., Provider]] = {
    "aws": _aws,
    "gcp": _gcp,
    "lambda": _lambda,
    "local": _local,
}


def create_provider(kind: str, **config: Any) -> Provider:
    """Build the adapter for `kind` from its keyword configuration."""
    try:
        factory = FACTORIES[kind]
    except KeyError:
        known = ", ".join(sorted(FACTORIES))
        raise InvalidRequest(f"unknown provider kind {kind!r}; use one of: {known}") from None
    return factory(**config)
