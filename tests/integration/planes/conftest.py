"""Fixtures of the tests that run both planes."""

from __future__ import annotations

import pytest

from tests.integration.api import builders as b


@pytest.fixture
def fleet(admin, session_factory) -> dict[str, str]:
    """One provider/region/pool, a cluster (its NATS password is shown once) and a deployment."""
    for path, body in (("providers", b.provider()), ("regions", b.region()), ("gpu-types", b.gpu_type()),
                       ("pools", b.pool())):  # fmt: skip
        assert admin.post(path, body).status_code == 201
    cluster = admin.post("clusters", b.cluster()).json()
    assert (
        admin.post(
            "deployments", b.deployment(autoscaling={"min_replicas": 2, "max_replicas": 4})
        ).status_code
        == 201
    )
    return cluster["nats_credentials"]
