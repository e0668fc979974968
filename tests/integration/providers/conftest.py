"""Local servers for the provider adapters (one of each per session, free ports) and one
`Harness` per adapter, so the contract suite is written once.

- aws: moto in server mode behind `Ec2Shim` (capacity reservations, ClientToken, faults);
- gcp: `FakeGce`; lambda: `FakeLambdaCloud`; local: a JSON-file `LocalProvider`.
Tests share servers: every test uses its own pool name and idempotency keys.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from providers.base import Instance, PoolRef, Provider, ProviderError, PurchaseType
from tests.fakes.ec2_shim import Ec2Shim
from tests.fakes.gce import FakeGce
from tests.fakes.lambda_cloud import API_KEY, FakeLambdaCloud

AWS_REGION = "us-east-1"
GCP_PROJECT = "gpufleet-test"
GCP_ZONE = "us-central1-a"
PROVIDERS = ["aws", "aws-reserved", "gcp", "lambda", "local"]


def new_key() -> str:
    return str(uuid.uuid4())


@dataclass
class ErrorCase:
    """`arrange()` sets the provider (or its server) up to fail; `act()` makes the call."""

    expected: type[ProviderError]
    arrange: Callable[[], None]
    act: Callable[[], object]


@dataclass
class Harness:
    name: str
    provider: Provider
    make_pool: Callable[[], PoolRef]
    unknown_id: str
    errors: dict[str, Callable[[], ErrorCase]] = field(default_factory=dict)
    interrupt: Callable[[Instance], None] | None = None
    clear_faults: Callable[[], None] = lambda: None


# -- servers (session) -------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_port() -> Iterator[int]:
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
    os.environ["MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION"] = "true"
    import moto.settings
    from moto.server import ThreadedMotoServer

    moto.settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = True
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield server.get_host_and_port()[1]
    server.stop()


@pytest.fixture(scope="session")
def ec2_shim(moto_port: int) -> Iterator[Ec2Shim]:
    shim = Ec2Shim(moto_port).start()
    yield shim
    shim.stop()


@pytest.fixture(scope="session")
def fake_gce() -> Iterator[FakeGce]:
    fake = FakeGce().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def fake_lambda() -> Iterator[FakeLambdaCloud]:
    fake = FakeLambdaCloud().start()
    yield fake
    fake.stop()


def aws_client(shim: Ec2Shim, service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=shim.url,
        region_name=AWS_REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="session")
def interruption_queue(ec2_shim: Ec2Shim) -> str:
    sqs = aws_client(ec2_shim, "sqs")
    return sqs.create_queue(QueueName="gpufleet-interruptions")["QueueUrl"]


# -- adapters ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def aws_provider(ec2_shim: Ec2Shim, interruption_queue: str) -> Any:
    from providers.aws import AwsProvider

    return AwsProvider(
        region=AWS_REGION,
        image_id="ami-0123456789abcdef0",
        instance_types=["g6e.xlarge", "p5.48xlarge"],
        on_demand_prices={"g6e.xlarge": 1.861, "p5.48xlarge": 98.32},
        interruption_queue_url=interruption_queue,
        endpoint_url=ec2_shim.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="session")
def gcp_provider(fake_gce: FakeGce) -> Any:
    from google.auth.credentials import AnonymousCredentials

    from providers.gcp import GcpProvider

    return GcpProvider(
        project=GCP_PROJECT,
        zones=[GCP_ZONE],
        on_demand_prices={"g2-standard-4": 0.71},
        spot_prices={"g2-standard-4": 0.28},
        endpoint=fake_gce.url,
        credentials=AnonymousCredentials(),
    )


@pytest.fixture(scope="session")
def lambda_provider(fake_lambda: FakeLambdaCloud) -> Any:
    from providers.lambda_cloud import LambdaProvider

    provider = LambdaProvider(api_key=API_KEY, ssh_key_name="ops", base_url=fake_lambda.url)
    yield provider
    provider.close()


@pytest.fixture
def local_provider(tmp_path: Path) -> Any:
    from providers.local import LocalProvider

    return LocalProvider(gpus_total=8, state_path=tmp_path / "local.json", max_instances=4)


def _pool(name: str, **fields: Any) -> Callable[[], PoolRef]:
    def make() -> PoolRef:
        return PoolRef(name=f"{name}-{uuid.uuid4().hex[:8]}", **fields)

    return make


def aws_harness(provider: Any, shim: Ec2Shim, queue_url: str) -> Harness:
    make_pool = _pool(
        "aws-spot",
        region=AWS_REGION,
        zone="us-east-1a",
        gpu_type="L40S",
        instance_type="g6e.xlarge",
        purchase_type=PurchaseType.SPOT,
        gpus_per_instance=1,
    )

    def injected(code: str, expected: type[ProviderError], status: int = 400) -> Any:
        return lambda: ErrorCase(
            expected,
            lambda: shim.inject("RunInstances", code, f"{code} (injected)", status),
            lambda: provider.create_instances(make_pool(), 1, new_key()),
        )

    def mismatched_key() -> ErrorCase:
        pool, key = make_pool(), new_key()
        return ErrorCase(
            _error("InvalidRequest"),
            lambda: provider.create_instances(pool, 1, key),
            lambda: provider.create_instances(pool, 2, key),
        )

    def unknown_type() -> ErrorCase:
        pool = PoolRef(
            f"aws-bogus-{uuid.uuid4().hex[:6]}", AWS_REGION, "us-east-1a", "H100-80G",
            "zz9.huge", PurchaseType.ON_DEMAND, 8,
        )  # fmt: skip
        return ErrorCase(_error("InvalidRequest"), lambda: None,
                         lambda: provider.create_instances(pool, 1, new_key()))  # fmt: skip

    def interrupt(instance: Instance) -> None:
        event = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": AWS_REGION,
            "resources": [f"arn:aws:ec2:{AWS_REGION}a:instance/{instance.id}"],
            "detail": {"instance-id": instance.id, "instance-action": "terminate"},
        }
        aws_client(shim, "sqs").send_message(QueueUrl=queue_url, MessageBody=json.dumps(event))

    return Harness(
        name="aws",
        provider=provider,
        make_pool=make_pool,
        unknown_id="i-0000000000000dead",
        errors={
            "InsufficientInstanceCapacity": injected(
                "InsufficientInstanceCapacity", _error("InsufficientCapacity")
            ),
            "InstanceLimitExceeded": injected("InstanceLimitExceeded", _error("QuotaExceeded")),
            "VcpuLimitExceeded": injected("VcpuLimitExceeded", _error("QuotaExceeded")),
            "MaxSpotInstanceCountExceeded": injected(
                "MaxSpotInstanceCountExceeded", _error("QuotaExceeded")
            ),
            "RequestLimitExceeded": injected("RequestLimitExceeded", _error("Throttled"), 503),
            "IdempotentParameterMismatch": mismatched_key,
            "InvalidInstanceType": unknown_type,
        },
        interrupt=interrupt,
        clear_faults=shim.clear_faults,
    )


def aws_reserved_harness(provider: Any, shim: Ec2Shim) -> Harness:
    ec2 = aws_client(shim, "ec2")

    def make_pool(slots: int = 4) -> PoolRef:
        reservation = ec2.create_capacity_reservation(
            InstanceType="p5.48xlarge",
            InstancePlatform="Linux/UNIX",
            AvailabilityZone="us-east-1b",
            InstanceCount=slots,
        )["CapacityReservation"]["CapacityReservationId"]
        return PoolRef(
            name=f"aws-reserved-{uuid.uuid4().hex[:8]}",
            region=AWS_REGION,
            zone="us-east-1b",
            gpu_type="H100-80G",
            instance_type="p5.48xlarge",
            purchase_type=PurchaseType.RESERVED,
            gpus_per_instance=8,
            capacity_reservation_id=reservation,
        )

    def full() -> ErrorCase:
        pool = make_pool(slots=1)
        return ErrorCase(_error("InsufficientCapacity"), lambda: None,
                         lambda: provider.create_instances(pool, 2, new_key()))  # fmt: skip

    def missing() -> ErrorCase:
        pool = PoolRef(
            "aws-reserved-missing", AWS_REGION, "us-east-1b", "H100-80G", "p5.48xlarge",
            PurchaseType.RESERVED, 8, capacity_reservation_id="cr-0000000000000dead",
        )  # fmt: skip
        return ErrorCase(_error("InvalidRequest"), lambda: None,
                         lambda: provider.create_instances(pool, 1, new_key()))  # fmt: skip

    return Harness(
        name="aws-reserved",
        provider=provider,
        make_pool=make_pool,
        unknown_id="i-0000000000000dead",
        errors={"ReservationCapacityExceeded": full, "InvalidCapacityReservationId": missing},
    )


def gcp_harness(provider: Any, fake: FakeGce) -> Harness:
    make_pool = _pool(
        "gcp-spot",
        region="us-central1",
        zone=GCP_ZONE,
        gpu_type="L4",
        instance_type="g2-standard-4",
        purchase_type=PurchaseType.SPOT,
        gpus_per_instance=1,
    )

    def case(expected: str, arrange: Callable[[], None]) -> Callable[[], ErrorCase]:
        return lambda: ErrorCase(
            _error(expected), arrange, lambda: provider.create_instances(make_pool(), 1, new_key())
        )

    def unknown_gpu() -> ErrorCase:
        pool = PoolRef("gcp-l40s", "us-central1", GCP_ZONE, "L40S", "g2-standard-4",
                       PurchaseType.ON_DEMAND, 1)  # fmt: skip
        return ErrorCase(_error("InvalidRequest"), lambda: None,
                         lambda: provider.create_instances(pool, 1, new_key()))  # fmt: skip

    exhausted = "The zone 'projects/gpufleet-test/zones/us-central1-a' does not have enough "
    return Harness(
        name="gcp",
        provider=provider,
        make_pool=make_pool,
        unknown_id=f"{GCP_ZONE}/gf-never-created-0",
        errors={
            "ZONE_RESOURCE_POOL_EXHAUSTED": case(
                "InsufficientCapacity",
                lambda: fake.inject_operation("ZONE_RESOURCE_POOL_EXHAUSTED", exhausted),
            ),
            "QUOTA_EXCEEDED-operation": case(
                "QuotaExceeded",
                lambda: fake.inject_operation("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS'", 403),
            ),
            "403-quotaExceeded": case(
                "QuotaExceeded",
                lambda: fake.inject_http(403, "Quota 'NVIDIA_L4_GPUS' exceeded.", "quotaExceeded"),
            ),
            "429-rateLimitExceeded": case(
                "Throttled",
                lambda: fake.inject_http(429, "Rate Limit Exceeded", "rateLimitExceeded"),
            ),
            "400-invalid": case(
                "InvalidRequest",
                lambda: fake.inject_http(400, "Invalid value for field 'resource.name'", "invalid"),
            ),
            "unknown-gpu-type": unknown_gpu,
        },
        interrupt=lambda instance: fake.preempt(*instance.id.split("/"), project=GCP_PROJECT),
        clear_faults=fake.clear_faults,
    )


def lambda_harness(provider: Any, fake: FakeLambdaCloud) -> Harness:
    make_pool = _pool(
        "lambda-od",
        region="us-east-1",
        zone=None,
        gpu_type="H100-80G",
        instance_type="gpu_1x_h100_pcie",
        purchase_type=PurchaseType.ON_DEMAND,
        gpus_per_instance=1,
    )

    def case(expected: str, arrange: Callable[[], None], pool: PoolRef | None = None) -> Any:
        return lambda: ErrorCase(
            _error(expected), arrange,
            lambda: provider.create_instances(pool or make_pool(), 1, new_key()),
        )  # fmt: skip

    def sold_out() -> None:
        fake.capacity[("gpu_8x_h100_sxm5", "us-west-1")] = 0

    sold_out_pool = PoolRef("lambda-8x", "us-west-1", None, "H100-80G", "gpu_8x_h100_sxm5",
                            PurchaseType.ON_DEMAND, 8)  # fmt: skip
    bad_region = PoolRef("lambda-mars", "mars-1", None, "H100-80G", "gpu_1x_h100_pcie",
                         PurchaseType.ON_DEMAND, 1)  # fmt: skip
    spot = PoolRef("lambda-spot", "us-east-1", None, "H100-80G", "gpu_1x_h100_pcie",
                   PurchaseType.SPOT, 1)  # fmt: skip
    return Harness(
        name="lambda",
        provider=provider,
        make_pool=make_pool,
        unknown_id="0000000000000000000000000000dead",
        errors={
            "insufficient-capacity": case("InsufficientCapacity", sold_out, sold_out_pool),
            "quota-exceeded": case(
                "QuotaExceeded", lambda: fake.inject(400, "global/quota-exceeded", "Quota exceeded")
            ),
            "429": case(
                "Throttled", lambda: fake.inject(429, "global/unknown", "Too many requests")
            ),
            "invalid-parameters": case("InvalidRequest", lambda: None, bad_region),
            "spot-pool": case("InvalidRequest", lambda: None, spot),
        },
        clear_faults=fake.clear_faults,
    )


def local_harness(provider: Any) -> Harness:
    make_pool = _pool(
        "local-spot",
        region="local",
        zone=None,
        gpu_type="L4",
        instance_type="local-1gpu",
        purchase_type=PurchaseType.SPOT,
        gpus_per_instance=1,
    )
    big = PoolRef("local-big", "local", None, "L4", "local-8gpu", PurchaseType.ON_DEMAND, 8)

    def quota() -> ErrorCase:
        return ErrorCase(_error("QuotaExceeded"), lambda: None,
                         lambda: provider.create_instances(make_pool(), 5, new_key()))  # fmt: skip

    def capacity() -> ErrorCase:
        return ErrorCase(_error("InsufficientCapacity"), lambda: None,
                         lambda: provider.create_instances(big, 2, new_key()))  # fmt: skip

    def bad_key() -> ErrorCase:
        return ErrorCase(_error("InvalidRequest"), lambda: None,
                         lambda: provider.create_instances(make_pool(), 1, "Not A Key!"))  # fmt: skip

    return Harness(
        name="local",
        provider=provider,
        make_pool=make_pool,
        unknown_id="local-000000000000",
        errors={"max-instances": quota, "out-of-gpus": capacity, "bad-key": bad_key},
        interrupt=lambda instance: provider.interrupt(instance.id, timedelta(minutes=2)),
    )


def _error(name: str) -> type[ProviderError]:
    import providers.base

    return getattr(providers.base, name)


@pytest.fixture(params=PROVIDERS)
def harness(request: pytest.FixtureRequest) -> Harness:
    return build_harness(request, request.param)


def build_harness(request: pytest.FixtureRequest, kind: str) -> Harness:
    """The harness for `kind`, starting the servers it needs (once per session)."""
    if kind == "aws":
        shim = request.getfixturevalue("ec2_shim")
        queue = request.getfixturevalue("interruption_queue")
        return aws_harness(request.getfixturevalue("aws_provider"), shim, queue)
    if kind == "aws-reserved":
        shim = request.getfixturevalue("ec2_shim")
        return aws_reserved_harness(request.getfixturevalue("aws_provider"), shim)
    if kind == "gcp":
        fake = request.getfixturevalue("fake_gce")
        return gcp_harness(request.getfixturevalue("gcp_provider"), fake)
    if kind == "lambda":
        fake = request.getfixturevalue("fake_lambda")
        return lambda_harness(request.getfixturevalue("lambda_provider"), fake)
    return local_harness(request.getfixturevalue("local_provider"))
