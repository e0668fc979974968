"""GCP Compute Engine through google-cloud-compute (REST transport).

Idempotency: instance i of key k is named `gf-<k>-<i>`; GCE names are unique per zone, so a
repeated insert (another call, a retry after a crash) meets the existing name (409), which
counts as success. Each insert also carries a fresh `requestId`, so the client library may
resend that one request safely. The request id is deliberately *not* derived from the key:
GCE replays the original operation for a reused id, so a key whose first insert failed
(stockout) could never be retried.
Operations are waited for with our own `ZoneOperationsClient.wait` on `*_unary` calls:
`ExtendedOperation` polling ignores `client_options` and would call the real API.
Spot preemptions are read from zone operations of type `compute.instances.preempted`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import Credentials
from google.cloud import compute_v1

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

LABEL_POOL = "gpufleet-pool"
LABEL_KEY = "gpufleet-key"
LABEL_PURCHASE = "gpufleet-purchase"
LABEL_GPUS = "gpufleet-gpus"
PREEMPTED = "compute.instances.preempted"
SPOT_NOTICE = timedelta(seconds=30)  # GCE: preemption notice is 30 seconds
_MAX_WAITS = 3  # each wait returns when done or after ~2 minutes on GCE
_ONCE: dict[str, Any] = {"retry": None, "timeout": 30.0}
"""Every call is tried once, for at most 30 s: procurement owns retries (the client's
default retried a list for up to 600 s, holding a sweep — and every provider after it)."""
_WAIT: dict[str, Any] = {"retry": None, "timeout": 150.0}
"""An operation's wait: GCE answers within ~2 minutes, done or not."""

# gpufleet GPU type → GCE accelerator type.
ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "L4": "nvidia-l4",
    "A100-40G": "nvidia-tesla-a100",
    "A100-80G": "nvidia-a100-80gb",
    "H100-80G": "nvidia-h100-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
}
GPU_MEMORY_MIB = {
    "T4": 16384,
    "V100": 16384,
    "L4": 24576,
    "A100-40G": 40960,
    "A100-80G": 81920,
    "H100-80G": 81920,
    "H200": 144384,
    "B200": 184320,
}
_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "STOPPED": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "SUSPENDED": InstanceState.STOPPING,
    "TERMINATED": InstanceState.STOPPED,  # stopped, not deleted: its disks still bill
}


def error_for_operation(code: str, message: str, doing: str) -> ProviderError:
    """Typed error for a GCE operation error code (e.g. ZONE_RESOURCE_POOL_EXHAUSTED)."""
    said = f"GCE refused {doing}: {code}: {message}"
    if "RESOURCE_POOL_EXHAUSTED" in code or code == "STOCKOUT":
        return InsufficientCapacity(
            f"{said}; try another zone, region or purchase type, or retry later"
        )
    if code == "QUOTA_EXCEEDED":
        return QuotaExceeded(f"{said}; request a higher GCE quota or use another pool")
    if code == "RATE_LIMIT_EXCEEDED":
        return Throttled(f"{said}; back off and retry")
    if code == "RESOURCE_NOT_FOUND":
        return NotFound(f"{said}; check the names in the pool and adapter configuration")
    if code.startswith("INVALID") or code in {"UNSUPPORTED_OPERATION", "CONDITION_NOT_MET"}:
        return InvalidRequest(f"{said}; fix the pool or adapter configuration")
    return ProviderError(said)


TRANSPORT_ERRORS = (requests.RequestException, auth_exceptions.TransportError, gexc.RetryError)
"""What the Compute client raises when GCE did not answer: `Unavailable`."""


def unavailable(exc: Exception, doing: str) -> Unavailable:
    return Unavailable(f"GCE did not answer {doing}: {exc}; retried as it was")


def error_for_http(exc: gexc.GoogleAPICallError, doing: str) -> ProviderError:
    """Typed error for an HTTP error of the Compute API (403/429 quota and rate limits;
    a 5xx or a deadline: `Unavailable`)."""
    reasons = {str(e.get("reason", "")) for e in exc.errors if isinstance(e, dict)}
    said = f"GCE refused {doing}: HTTP {exc.code}: {exc.message}"
    if isinstance(exc, gexc.ServerError | gexc.DeadlineExceeded):
        return Unavailable(f"GCE failed {doing}: HTTP {exc.code}: {exc.message}; retried")
    if isinstance(exc, gexc.TooManyRequests) or reasons & {
        "rateLimitExceeded",
        "userRateLimitExceeded",
    }:
        return Throttled(f"{said}; back off and retry")
    if reasons & {"quotaExceeded", "QUOTA_EXCEEDED"}:
        return QuotaExceeded(f"{said}; request a higher GCE quota or use another pool")
    if isinstance(exc, gexc.NotFound):
        return NotFound(f"{said}; check the project, zone and names")
    if isinstance(exc, gexc.BadRequest | gexc.Conflict):
        return InvalidRequest(f"{said}; fix the pool or adapter configuration")
    if isinstance(exc, gexc.Forbidden):
        return ProviderError(f"{said}; grant the credentials compute.instances.* permissions")
    return ProviderError(said)


def instance_name(key: str, index: int) -> str:
    return f"gf-{key}-{index}"


def request_id() -> str:
    """A fresh UUID per insert (see the module docstring for why not one per key)."""
    return str(uuid.uuid4())


def _label(value: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def _last(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


class GcpProvider:
    """One GCP project, over the zones it is configured with.

    Instance ids are `<zone>/<name>`. GCE publishes no prices through the Compute API, so
    `on_demand_prices` and `spot_prices` (machine type → USD/hour) fill the offers.
    """

    kind = "gcp"

    def __init__(
        self,
        *,
        project: str,
        zones: Iterable[str],
        source_image: str = "projects/debian-cloud/global/images/family/debian-12",
        network: str = "global/networks/default",
        disk_size_gb: int = 200,
        on_demand_prices: Mapping[str, float] | None = None,
        spot_prices: Mapping[str, float] | None = None,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        options = {"api_endpoint": endpoint} if endpoint else None
        common: dict[str, Any] = {
            "credentials": credentials,
            "client_options": options,
            "transport": "rest",
        }
        self._instances = compute_v1.InstancesClient(**common)
        self._operations = compute_v1.ZoneOperationsClient(**common)
        self._machine_types = compute_v1.MachineTypesClient(**common)
        self._project = project
        self._zones = list(zones)
        self._image = source_image
        self._network = network
        self._disk_gb = disk_size_gb
        self._od_prices = dict(on_demand_prices or {})
        self._spot_prices = dict(spot_prices or {})

    # -- offers ----------------------------------------------------------------------

    def offers(self) -> list[Offer]:
        offers = []
        for zone in self._zones:
            try:
                machine_types = list(
                    self._machine_types.list(project=self._project, zone=zone, **_ONCE)
                )
            except gexc.GoogleAPICallError as exc:
                raise error_for_http(exc, f"listing machine types in {zone}") from exc
            except TRANSPORT_ERRORS as exc:
                raise unavailable(exc, f"listing machine types in {zone}") from exc
            for mt in machine_types:
                if not mt.accelerators:
                    continue
                accel = mt.accelerators[0]
                gpu = gpu_type(accel.guest_accelerator_type)
                offers.append(
                    Offer(
                        provider=self.kind,
                        gpu_type=gpu,
                        gpus_per_instance=accel.guest_accelerator_count,
                        gpu_memory_mib=GPU_MEMORY_MIB.get(gpu, 0),
                        instance_type=mt.name,
                        region=zone.rsplit("-", 1)[0],
                        zone=zone,
                        on_demand_price=self._od_prices.get(mt.name),
                        spot_price=self._spot_prices.get(mt.name),
                        available=True,
                    )
                )
        return offers

    # -- instances -------------------------------------------------------------------

    def create_instances(self, pool: PoolRef, count: int, idempotency_key: str) -> list[Instance]:
        check_idempotency_key(idempotency_key)
        check_count(count)
        if not pool.zone:
            raise InvalidRequest(f"pool {pool.name!r} has no zone; GCE instances need one")
        # the key's instances wherever they are: a retry after the offers refresh moved the
        # pool to another zone made a second instance of the same name there, which no sweep
        # ever adopted or deleted (names are unique per zone only)
        made = {
            i.id.rsplit("/", 1)[-1]: i
            for i in self.list_instances()
            if i.idempotency_key == idempotency_key
        }
        return [
            made.get(instance_name(idempotency_key, i))
            or self._create_one(pool, idempotency_key, i)
            for i in range(count)
        ]

    def _create_one(self, pool: PoolRef, key: str, index: int) -> Instance:
        zone = pool.zone or ""
        name = instance_name(key, index)
        request = compute_v1.InsertInstanceRequest(
            project=self._project,
            zone=zone,
            request_id=request_id(),
            instance_resource=self._resource(pool, key, name),
        )
        doing = f"creating {name} ({pool.instance_type}) for pool {pool.name!r} in {zone}"
        try:
            operation = self._instances.insert_unary(request=request, **_ONCE)
            self._wait(operation, zone, doing)
        except gexc.Conflict:
            pass  # the name exists: an earlier call with this key created it
        except gexc.GoogleAPICallError as exc:
            raise error_for_http(exc, doing) from exc
        except TRANSPORT_ERRORS as exc:
            raise unavailable(exc, doing) from exc
        try:
            raw = self._instances.get(project=self._project, zone=zone, instance=name, **_ONCE)
        except gexc.GoogleAPICallError as exc:
            raise error_for_http(exc, f"reading {name} after creating it") from exc
        except TRANSPORT_ERRORS as exc:
            raise unavailable(exc, f"reading {name} after creating it") from exc
        return self._instance(raw)

    def _resource(self, pool: PoolRef, key: str, name: str) -> compute_v1.Instance:
        zone = pool.zone or ""
        accelerator = ACCELERATORS.get(pool.gpu_type)
        if accelerator is None:
            known = ", ".join(sorted(ACCELERATORS))
            raise InvalidRequest(
                f"pool {pool.name!r}: GCE has no accelerator for GPU type {pool.gpu_type!r}; "
                f"use one of {known}"
            )
        spot = pool.purchase_type is PurchaseType.SPOT
        scheduling = compute_v1.Scheduling(
            provisioning_model="SPOT" if spot else "STANDARD",
            on_host_maintenance="TERMINATE",  # required with GPUs
            automatic_restart=not spot,
        )
        if spot:
            scheduling.instance_termination_action = "DELETE"
        resource = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{pool.instance_type}",
            scheduling=scheduling,
            guest_accelerators=[
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator}",
                    accelerator_count=pool.gpus_per_instance,
                )
            ],
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=self._image, disk_size_gb=self._disk_gb
                    ),
                )
            ],
            network_interfaces=[compute_v1.NetworkInterface(network=self._network)],
            labels={
                LABEL_POOL: _label(pool.name),
                LABEL_KEY: key,
                LABEL_PURCHASE: str(pool.purchase_type),
                LABEL_GPUS: str(pool.gpus_per_instance),
            },
        )
        if pool.purchase_type is PurchaseType.RESERVED:
            resource.reservation_affinity = compute_v1.ReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key="compute.googleapis.com/reservation-name",
                values=[pool.capacity_reservation_id or ""],
            )
        return resource

    def _wait(self, operation: compute_v1.Operation, zone: str, doing: str) -> None:
        for _ in range(_MAX_WAITS):
            if operation.status == compute_v1.Operation.Status.DONE:
                break
            operation = self._operations.wait(
                project=self._project, zone=zone, operation=operation.name, **_WAIT
            )
        else:
            raise Unavailable(f"GCE operation {operation.name} ({doing}) did not finish; retried")
        if operation.error and operation.error.errors:
            first = operation.error.errors[0]
            raise error_for_operation(first.code, first.message, doing)

    def delete_instance(self, instance_id: str) -> None:
        zone, _, name = instance_id.partition("/")
        if not name:
            raise InvalidRequest(f"GCE instance id {instance_id!r} is not '<zone>/<name>'")
        doing = f"deleting {instance_id}"
        try:
            operation = self._instances.delete_unary(
                project=self._project, zone=zone, instance=name, **_ONCE
            )
            self._wait(operation, zone, doing)
        except gexc.NotFound:
            return
        except NotFound:
            return
        except gexc.GoogleAPICallError as exc:
            raise error_for_http(exc, doing) from exc
        except TRANSPORT_ERRORS as exc:
            raise unavailable(exc, doing) from exc

    def list_instances(self) -> list[Instance]:
        request = compute_v1.AggregatedListInstancesRequest(project=self._project)
        try:
            pages = list(self._instances.aggregated_list(request=request, **_ONCE))
        except gexc.GoogleAPICallError as exc:
            raise error_for_http(exc, "listing instances") from exc
        except TRANSPORT_ERRORS as exc:
            raise unavailable(exc, "listing instances") from exc
        return [
            self._instance(raw)
            for _, scoped in pages
            for raw in scoped.instances
            if LABEL_POOL in raw.labels
        ]

    def interruption_notices(self) -> list[InterruptionNotice]:
        live = {i.id for i in self.list_instances()}
        notices = []
        for zone in self._zones:
            try:
                operations = list(
                    self._operations.list(
                        request=compute_v1.ListZoneOperationsRequest(
                            project=self._project,
                            zone=zone,
                            filter=f'operationType="{PREEMPTED}"',
                        ),
                        **_ONCE,
                    )
                )
            except gexc.GoogleAPICallError as exc:
                raise error_for_http(exc, f"listing operations in {zone}") from exc
            except TRANSPORT_ERRORS as exc:
                raise unavailable(exc, f"listing operations in {zone}") from exc
            for op in operations:
                instance_id = f"{zone}/{_last(op.target_link)}"
                if op.operation_type != PREEMPTED or instance_id not in live:
                    continue
                started = datetime.fromisoformat(op.insert_time.replace("Z", "+00:00"))
                notices.append(
                    InterruptionNotice(instance_id, started + SPOT_NOTICE, "spot-preemption")
                )
        return notices

    def _instance(self, raw: compute_v1.Instance) -> Instance:
        zone = _last(raw.zone)
        labels = dict(raw.labels)
        purchase = labels.get(LABEL_PURCHASE)
        if purchase is None:
            spot = raw.scheduling.provisioning_model == "SPOT"
            purchase = "spot" if spot else "on_demand"
        interfaces = list(raw.network_interfaces)
        return Instance(
            id=f"{zone}/{raw.name}",
            pool=labels.get(LABEL_POOL),
            idempotency_key=labels.get(LABEL_KEY),
            instance_type=_last(raw.machine_type),
            region=zone.rsplit("-", 1)[0],
            zone=zone,
            purchase_type=PurchaseType(purchase),
            gpus=sum(a.accelerator_count for a in raw.guest_accelerators),
            state=_STATES.get(raw.status, InstanceState.UNKNOWN),
            address=interfaces[0].network_i_p if interfaces else None,
        )
