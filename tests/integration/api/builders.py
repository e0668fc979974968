"""Small builders for API bodies: sensible defaults, override what the story needs."""

from __future__ import annotations

from typing import Any


def provider(name: str = "aws-main", **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider_kind": "aws",
        "provider_class": "hyperscaler",
        "certifications": ["SOC2", "HIPAA"],
        "credentials_ref": "env:AWS_PROFILE",
    } | kw


def region(name: str = "aws-us-east-1", provider: str = "aws-main", **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": provider,
        "code": name.split("-", 1)[1],
        "jurisdiction": "US",
        "latitude": 38.9,
        "longitude": -77.4,
    } | kw


def gpu_type(name: str = "H100-80G", **kw: Any) -> dict[str, Any]:
    return {"name": name, "memory_gib": 80} | kw


def pool(name: str = "aws-use1-h100-od", **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": "aws-main",
        "region": "aws-us-east-1",
        "gpu_type": "H100-80G",
        "purchase_type": "on_demand",
        "gpus": 64,
        "price_per_gpu_hour": "3.933750",
        "quota_gpus": 128,
    } | kw


def reserved_pool(name: str = "aws-use1-h100-rsv", **kw: Any) -> dict[str, Any]:
    base = pool(
        name,
        purchase_type="reserved",
        price_per_gpu_hour="2.100000",
        term_start="2026-01-01T00:00:00Z",
        term_end="2027-01-01T00:00:00Z",
        committed_gpus=64,
    )
    base.pop("quota_gpus")
    return base | kw


def cluster(name: str = "use1-a", **kw: Any) -> dict[str, Any]:
    return {"name": name, "region": "aws-us-east-1", "pools": ["aws-use1-h100-od"]} | kw


def deployment(name: str = "chat-llm", **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "gpus_per_replica": 1,
        "gpu_types": ["H100-80G"],
        "autoscaling": {"min_replicas": 1, "max_replicas": 4},
    } | kw


def seed(api: Any) -> None:
    """A provider, region, GPU type, on-demand pool and cluster: enough for most stories."""
    for path, body in (
        ("providers", provider()),
        ("regions", region()),
        ("gpu-types", gpu_type()),
        ("pools", pool()),
        ("clusters", cluster()),
    ):
        response = api.post(path, body)
        assert response.status_code == 201, response.text
