"""Lambda Cloud over its public REST API (httpx): instance types with prices and regional
availability, launch, terminate, list.

Lambda has no idempotency key. Instance i of key k is *named* `gf-<k>-<i>`; creation lists
instances first and launches only names that are missing (one per launch call, as the API
allows quantity 1). A per-key lock covers threads of one process; across processes,
callers must not run two creations with the same key at once (procurement holds the key's
row lock). Lambda has no spot market, so there are no interruption notices.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

import httpx

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

DEFAULT_URL = "https://cloud.lambdalabs.com/api/v1"
PREFIX = "gf-"
_STATES = {
    "booting": InstanceState.PENDING,
    "active": InstanceState.RUNNING,
    "unhealthy": InstanceState.UNKNOWN,
}
_GONE = {"terminating", "terminated"}
_INVALID = {
    "global/invalid-parameters",
    "global/invalid-address",
    "instance-operations/launch/file-system-in-wrong-region",
    "instance-operations/launch/file-systems-not-supported",
}


def error_for(status: int, code: str, message: str, doing: str) -> ProviderError:
    """Typed error for Lambda's `{"error": {"code", "message"}}` body and HTTP status."""
    said = f"Lambda refused {doing}: {code or status}: {message}"
    if code == "instance-operations/launch/insufficient-capacity":
        return InsufficientCapacity(f"{said}; try another region or instance type, or later")
    if code == "global/quota-exceeded":
        return QuotaExceeded(f"{said}; ask Lambda to raise the account's instance limit")
    if status == 429:
        return Throttled(f"{said}; back off and retry")
    if status >= 500:
        return Unavailable(f"Lambda failed {doing}: {code or status}: {message}; retried")
    if code == "global/object-does-not-exist" or status == 404:
        return NotFound(f"{said}; check the instance type, region or instance id")
    if code in _INVALID or status == 400:
        return InvalidRequest(f"{said}; fix the pool or adapter configuration")
    if code in {"global/invalid-api-key", "global/account-inactive"} or status in {401, 403}:
        return ProviderError(f"{said}; set a valid, active Lambda API key")
    return ProviderError(said)


def instance_name(key: str, index: int) -> str:
    return f"{PREFIX}{key}-{index}"


def key_of(name: str | None) -> str | None:
    """The idempotency key encoded in a gpufleet instance name, else None."""
    if not name or not name.startswith(PREFIX):
        return None
    key, _, index = name[len(PREFIX) :].rpartition("-")
    return key if key and index.isdigit() else None


class LambdaProvider:
    """One Lambda Cloud account. `regions` lists the regions offers are reported for when
    a type has no capacity anywhere (the API names only regions with capacity)."""

    kind = "lambda"

    def __init__(
        self,
        *,
        api_key: str,
        ssh_key_name: str,
        base_url: str = DEFAULT_URL,
        regions: Iterable[str] = ("us-east-1", "us-west-1", "us-south-1"),
        timeout_s: float = 30.0,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, auth=(api_key, ""), timeout=timeout_s, follow_redirects=False
        )
        self._ssh_key = ssh_key_name
        self._regions = list(regions)
        self._key_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def _request(self, doing: str, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:  # no answer (a timeout, a broken connection)
            raise Unavailable(f"Lambda did not answer {doing}: {exc}; retried as it was") from exc
        if response.is_success:
            return response.json().get("data")
        try:
            error = response.json().get("error") or {}
        except ValueError:
            error = {}
        code, message = str(error.get("code", "")), str(error.get("message", response.text))
        raise error_for(response.status_code, code, message, doing)

    # -- offers ----------------------------------------------------------------------

    def offers(self) -> list[Offer]:
        types = self._request("listing instance types", "GET", "/instance-types") or {}
        offers = []
        for name, entry in sorted(types.items()):
            spec = entry["instance_type"]
            gpus = int(spec.get("specs", {}).get("gpus", 0))
            if gpus < 1:
                continue
            with_capacity = {r["name"] for r in entry.get("regions_with_capacity_available", [])}
            described = str(spec.get("gpu_description", spec.get("description", name)))
            gpu = gpu_type(described)
            for region in sorted(with_capacity | set(self._regions)):
                offers.append(
                    Offer(
                        provider=self.kind,
                        gpu_type=gpu,
                        gpus_per_instance=gpus,
                        gpu_memory_mib=_memory_mib(described),
                        instance_type=name,
                        region=region,
                        zone=None,
                        on_demand_price=int(spec["price_cents_per_hour"]) / 100,
                        spot_price=None,
                        available=region in with_capacity,
                    )
                )
        return offers

    # -- instances -------------------------------------------------------------------

    def create_instances(self, pool: PoolRef, count: int, idempotency_key: str) -> list[Instance]:
        check_idempotency_key(idempotency_key)
        check_count(count)
        if pool.purchase_type is not PurchaseType.ON_DEMAND:
            raise InvalidRequest(
                f"pool {pool.name!r} is {pool.purchase_type}; Lambda's API launches "
                "on-demand instances only: make the pool on_demand"
            )
        names = [instance_name(idempotency_key, i) for i in range(count)]
        with self._key_lock(idempotency_key):
            held = {i["name"]: i for i in self._raw_instances() if i.get("name") in names}
            for name in names:
                if name in held:
                    continue
                launched = self._request(
                    f"launching {name} ({pool.instance_type}) for pool {pool.name!r}",
                    "POST",
                    "/instance-operations/launch",
                    {
                        "region_name": pool.region,
                        "instance_type_name": pool.instance_type,
                        "ssh_key_names": [self._ssh_key],
                        "quantity": 1,
                        "name": name,
                    },
                )
                if not (launched or {}).get("instance_ids"):
                    raise InsufficientCapacity(
                        f"Lambda launched no {pool.instance_type} in {pool.region} for "
                        f"{name}; try another region or instance type, or later"
                    )
            held = {i["name"]: i for i in self._raw_instances() if i.get("name") in names}
        return [self._instance(held[n]) for n in names if n in held]

    def delete_instance(self, instance_id: str) -> None:
        try:
            self._request(
                f"terminating {instance_id}",
                "POST",
                "/instance-operations/terminate",
                {"instance_ids": [instance_id]},
            )
        except NotFound:
            return

    def list_instances(self) -> list[Instance]:
        return [self._instance(i) for i in self._raw_instances()]

    def interruption_notices(self) -> list[InterruptionNotice]:
        return []

    def _raw_instances(self) -> list[dict[str, Any]]:
        data = self._request("listing instances", "GET", "/instances") or []
        return [i for i in data if key_of(i.get("name")) and i.get("status") not in _GONE]

    def _instance(self, raw: dict[str, Any]) -> Instance:
        spec = raw.get("instance_type") or {}
        return Instance(
            id=raw["id"],
            pool=None,
            idempotency_key=key_of(raw.get("name")),
            instance_type=str(spec.get("name", "")),
            region=str((raw.get("region") or {}).get("name", "")),
            zone=None,
            purchase_type=PurchaseType.ON_DEMAND,
            gpus=int((spec.get("specs") or {}).get("gpus", 0)),
            state=_STATES.get(str(raw.get("status")), InstanceState.UNKNOWN),
            address=raw.get("ip"),
        )

    def _key_lock(self, key: str) -> threading.Lock:
        with self._locks_lock:
            return self._key_locks.setdefault(key, threading.Lock())


def _memory_mib(description: str) -> int:
    found = re.search(r"(\d+)\s*GB", description)
    return int(found.group(1)) * 1024 if found else 0
