"""AWS EC2 through boto3: on-demand, spot and capacity-reservation launches; offers from
`describe_instance_types` and spot price history; spot interruption warnings from an SQS
queue fed by an EventBridge rule (Karpenter's design).

Idempotency: `ClientToken` = the idempotency key, all-or-nothing (`MinCount = MaxCount`).
Instances carry `gpufleet:*` tags; only tagged instances are listed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from boto3.session import Session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from providers.base import (
    Instance,
    InstanceState,
    InsufficientCapacity,
    InterruptionNotice,
    InvalidRequest,
    NotFound,
    Offer,
    PoolRef,
    ProviderError,
    PurchaseType,
    QuotaExceeded,
    Throttled,
    Unavailable,
    check_count,
    check_idempotency_key,
)
from providers.gpus import gpu_type

TAG_POOL = "gpufleet:pool"
TAG_KEY = "gpufleet:idempotency-key"
TAG_PURCHASE = "gpufleet:purchase-type"
TAG_GPUS = "gpufleet:gpus"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
SPOT_NOTICE = timedelta(minutes=2)  # AWS: the warning comes two minutes ahead
DEFAULT_TYPES = ("p5*.*", "p4d.*", "g6e.*", "g6.*", "g5.*")
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPING,
}
_CAPACITY = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "ReservationCapacityExceeded",
    "SpotMaxPriceTooLow",
}
_THROTTLE = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled"}
_QUOTA = {"MaxSpotInstanceCountExceeded"}
_UNAVAILABLE = {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
                "RequestTimeout"}  # fmt: skip


def error_for(code: str, message: str, doing: str, status: int = 400) -> ProviderError:
    """The typed error for an EC2 error `code` (and HTTP `status`); `doing` names the call
    for the message."""
    said = f"AWS refused {doing}: {code}: {message}"
    if code in _UNAVAILABLE:
        return Unavailable(f"AWS failed {doing}: {code}: {message}; retried as it was")
    if code in _CAPACITY:
        return InsufficientCapacity(
            f"{said}; try another zone, region or purchase type, or retry later"
        )
    if code in _THROTTLE:
        return Throttled(f"{said}; back off and retry")
    if code in _QUOTA or code.endswith("LimitExceeded"):
        return QuotaExceeded(f"{said}; request a higher EC2 service quota or use another pool")
    if code == "InvalidInstanceID.NotFound":
        return NotFound(f"{said}; check the id (it may have been deleted)")
    if code.startswith("Invalid") or code in {
        "IdempotentParameterMismatch",
        "MissingParameter",
        "Unsupported",
        "UnsupportedOperation",
    }:
        return InvalidRequest(f"{said}; fix the pool or adapter configuration")
    if status >= 500:  # a code not known here, on a server error (EC2 throttles with 503)
        return Unavailable(f"AWS failed {doing}: {code}: {message}; retried as it was")
    return ProviderError(said)


def _translate(exc: Exception, doing: str) -> ProviderError:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 400
        code, message = str(err.get("Code", "Unknown")), str(err.get("Message", ""))
        return error_for(code, message, doing, int(status))
    if isinstance(exc, HTTPClientError | BotoConnectionError):  # no answer (a timeout too)
        return Unavailable(f"AWS did not answer {doing}: {exc}; retried as it was")
    return ProviderError(f"AWS call failed during {doing}: {exc}; check the endpoint and network")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AwsProvider:
    """One AWS account in one region.

    `on_demand_prices` (instance type → USD/hour) fills `Offer.on_demand_price`: EC2 does
    not publish on-demand prices (the Pricing API is a separate service). Set
    `interruption_queue_url` to the SQS queue an EventBridge rule sends
    "EC2 Spot Instance Interruption Warning" events to; without it there are no notices.
    """

    kind = "aws"

    def __init__(
        self,
        *,
        region: str,
        image_id: str,
        subnet_id: str | None = None,
        security_group_ids: Iterable[str] = (),
        instance_types: Iterable[str] = DEFAULT_TYPES,
        on_demand_prices: Mapping[str, float] | None = None,
        interruption_queue_url: str | None = None,
        endpoint_url: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        # Procurement owns retries (backoff with jitter): botocore must not retry as well.
        config = Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,  # botocore's 60 s each held a sweep, and every provider after it
        )
        session = Session(
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            region_name=region,
        )
        self._ec2: Any = session.client("ec2", endpoint_url=endpoint_url, config=config)
        self._sqs: Any = session.client("sqs", endpoint_url=endpoint_url, config=config)
        self._region = region
        self._image_id = image_id
        self._subnet_id = subnet_id
        self._security_group_ids = list(security_group_ids)
        self._instance_types = list(instance_types)
        self._prices = dict(on_demand_prices or {})
        self._queue_url = interruption_queue_url
        self._clock = clock
        self._notices: dict[str, InterruptionNotice] = {}

    def _call(self, doing: str, method: str, **params: Any) -> Any:
        try:
            return getattr(self._ec2, method)(**params)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, doing) from exc

    def _pages(self, doing: str, method: str, key: str, **params: Any) -> list[Any]:
        try:
            pages = self._ec2.get_paginator(method).paginate(**params)
            return [item for page in pages for item in page.get(key, [])]
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, doing) from exc

    # -- offers ----------------------------------------------------------------------

    def offers(self) -> list[Offer]:
        type_filter = [{"Name": "instance-type", "Values": self._instance_types}]
        types = self._pages(
            "describe_instance_types",
            "describe_instance_types",
            "InstanceTypes",
            Filters=type_filter,
        )
        gpu_types = {t["InstanceType"]: t["GpuInfo"] for t in types if t.get("GpuInfo")}
        if not gpu_types:
            return []
        names = sorted(gpu_types)
        zones = self._pages(
            "describe_instance_type_offerings",
            "describe_instance_type_offerings",
            "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": names}],
        )
        spot = self._spot_prices(names)
        offers = []
        for offering in zones:
            name, zone = offering["InstanceType"], offering["Location"]
            gpu = gpu_types[name]["Gpus"][0]
            memory = int(gpu.get("MemoryInfo", {}).get("SizeInMiB", 0))
            offers.append(
                Offer(
                    provider=self.kind,
                    gpu_type=gpu_type(gpu["Name"], memory),
                    gpus_per_instance=sum(int(g["Count"]) for g in gpu_types[name]["Gpus"]),
                    gpu_memory_mib=memory,
                    instance_type=name,
                    region=self._region,
                    zone=zone,
                    on_demand_price=self._prices.get(name),
                    spot_price=spot.get((name, zone)),
                    available=True,
                )
            )
        return sorted(offers, key=lambda o: (o.instance_type, o.zone or ""))

    def _spot_prices(self, names: list[str]) -> dict[tuple[str, str], float]:
        history = self._pages(
            "describe_spot_price_history",
            "describe_spot_price_history",
            "SpotPriceHistory",
            InstanceTypes=names,
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=self._clock(),
        )
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        for entry in history:
            where = (entry["InstanceType"], entry["AvailabilityZone"])
            seen = newest.get(where)
            if seen is None or entry["Timestamp"] > seen[0]:
                newest[where] = (entry["Timestamp"], float(entry["SpotPrice"]))
        return {where: price for where, (_, price) in newest.items()}

    # -- instances -------------------------------------------------------------------

    def create_instances(self, pool: PoolRef, count: int, idempotency_key: str) -> list[Instance]:
        check_idempotency_key(idempotency_key)
        check_count(count)
        tags = {
            TAG_POOL: pool.name,
            TAG_KEY: idempotency_key,
            TAG_PURCHASE: str(pool.purchase_type),
            TAG_GPUS: str(pool.gpus_per_instance),
        }
        params: dict[str, Any] = {
            "ImageId": self._image_id,
            "InstanceType": pool.instance_type,
            "MinCount": count,
            "MaxCount": count,
            "ClientToken": idempotency_key,
            "TagSpecifications": [
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
        }
        if pool.zone:
            params["Placement"] = {"AvailabilityZone": pool.zone}
        if self._subnet_id:
            params["SubnetId"] = self._subnet_id
        if self._security_group_ids:
            params["SecurityGroupIds"] = self._security_group_ids
        if pool.purchase_type is PurchaseType.SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        elif pool.purchase_type is PurchaseType.RESERVED:
            params["CapacityReservationSpecification"] = {
                "CapacityReservationTarget": {
                    "CapacityReservationId": pool.capacity_reservation_id,
                }
            }
        doing = f"launching {count}x {pool.instance_type} for pool {pool.name!r}"
        try:
            reply = self._call(doing, "run_instances", **params)
        except InvalidRequest as exc:
            # the key was used with other parameters: an earlier call with it (its answer
            # lost, the pool's zone or type refreshed since) launched them — the contract's
            # "returns the first call's instances", never a second launch nor a 30-min block
            if "IdempotentParameterMismatch" not in str(exc):
                raise
            made = self._by_key(idempotency_key, doing)
            if len(made) != count:  # another count: a caller's mistake, said as such
                raise
            return made
        return [self._instance(i) for i in reply["Instances"]]

    def _by_key(self, idempotency_key: str, doing: str) -> list[Instance]:
        reservations = self._pages(
            f"{doing}: finding the instances of its key",
            "describe_instances",
            "Reservations",
            Filters=[
                {"Name": f"tag:{TAG_KEY}", "Values": [idempotency_key]},
                {"Name": "instance-state-name", "Values": _LIVE_STATES},
            ],
        )
        return [self._instance(i) for r in reservations for i in r["Instances"]]

    def delete_instance(self, instance_id: str) -> None:
        try:
            self._call(
                f"terminating {instance_id}", "terminate_instances", InstanceIds=[instance_id]
            )
        except NotFound:
            return

    def list_instances(self) -> list[Instance]:
        reservations = self._pages(
            "describe_instances",
            "describe_instances",
            "Reservations",
            Filters=[
                {"Name": "tag-key", "Values": [TAG_POOL]},
                {"Name": "instance-state-name", "Values": _LIVE_STATES},
            ],
        )
        return [self._instance(i) for r in reservations for i in r["Instances"]]

    def interruption_notices(self) -> list[InterruptionNotice]:
        """Drains the interruption queue (messages are deleted once read, so each adapter
        process sees a warning once and keeps it until its instance is gone)."""
        if self._queue_url:
            self._drain_queue(self._queue_url)
        if not self._notices:
            return []
        live = {i.id for i in self.list_instances()}
        for gone in set(self._notices) - live:
            del self._notices[gone]
        return list(self._notices.values())

    def _drain_queue(self, queue_url: str) -> None:
        while True:
            try:
                reply = self._sqs.receive_message(
                    QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
                )
            except (ClientError, BotoCoreError) as exc:
                raise _translate(exc, "reading the interruption queue") from exc
            messages = reply.get("Messages", [])
            if not messages:
                return
            for message in messages:
                notice = notice_from_event(message["Body"])
                if notice:
                    self._notices[notice.instance_id] = notice
                try:
                    self._sqs.delete_message(
                        QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"]
                    )
                except (ClientError, BotoCoreError) as exc:
                    raise _translate(exc, "deleting an interruption message") from exc

    def _instance(self, raw: Mapping[str, Any]) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        purchase = tags.get(TAG_PURCHASE)
        if purchase is None:
            purchase = "spot" if raw.get("InstanceLifecycle") == "spot" else "on_demand"
        zone = raw.get("Placement", {}).get("AvailabilityZone")
        return Instance(
            id=raw["InstanceId"],
            pool=tags.get(TAG_POOL),
            idempotency_key=tags.get(TAG_KEY),
            instance_type=raw["InstanceType"],
            region=self._region,
            zone=zone,
            purchase_type=PurchaseType(purchase),
            gpus=int(tags.get(TAG_GPUS, "0")),
            state=_STATES.get(raw.get("State", {}).get("Name", ""), InstanceState.UNKNOWN),
            address=raw.get("PrivateIpAddress"),
        )


def notice_from_event(body: str) -> InterruptionNotice | None:
    """Parse an EventBridge event as delivered to SQS; None for other events or junk."""
    try:
        event = json.loads(body)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("detail-type") != SPOT_WARNING:
        return None
    detail = event.get("detail") or {}
    instance_id = detail.get("instance-id")
    try:
        sent = datetime.fromisoformat(str(event.get("time", "")).replace("Z", "+00:00"))
    except ValueError:
        return None
    if not instance_id:
        return None
    return InterruptionNotice(
        instance_id=instance_id, deadline=sent + SPOT_NOTICE, reason="spot-interruption"
    )
