"""`local`: instances that are slices of this machine's (virtual) GPUs.

State lives in one JSON file (shared by every process that opens the same path, guarded
by an exclusive `flock`) or in memory when no path is given. Used by `make up` and the
end-to-end tests; `interrupt()` plays the provider taking a spot instance back.
"""

from __future__ import annotations

import fcntl
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from providers.base import (
    Instance,
    InstanceState,
    InsufficientCapacity,
    InterruptionNotice,
    InvalidRequest,
    NotFound,
    Offer,
    PoolRef,
    PurchaseType,
    QuotaExceeded,
    check_count,
    check_idempotency_key,
)

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LocalProvider:
    """Capacity on this machine: `gpus_total` virtual GPUs of `gpu_type`.

    `max_instances` plays an account quota (QuotaExceeded); running out of GPUs plays
    InsufficientCapacity. Instance ids are `local-<hex>`.
    """

    kind = "local"

    def __init__(
        self,
        *,
        gpus_total: int = 8,
        gpu_type: str = "L4",
        gpu_memory_mib: int = 24 * 1024,
        region: str = "local",
        state_path: str | Path | None = None,
        max_instances: int | None = None,
        price_per_gpu_hour: float = 0.0,
        clock: Clock = _utcnow,
    ) -> None:
        self._gpus_total = gpus_total
        self._gpu_type = gpu_type
        self._gpu_memory_mib = gpu_memory_mib
        self._region = region
        self._path = Path(state_path) if state_path else None
        self._max_instances = max_instances
        self._price = price_per_gpu_hour
        self._clock = clock
        self._lock = threading.Lock()
        self._memory: dict[str, Any] = {"instances": {}, "notices": {}}

    # -- state ---------------------------------------------------------------------

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The whole state, read and written back under a thread lock and a file lock."""
        with self._lock:
            if self._path is None:
                yield self._memory
                return
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._path, "a+", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.seek(0)
                raw = f.read()
                state = json.loads(raw) if raw else {"instances": {}, "notices": {}}
                yield state
                f.seek(0)
                f.truncate()
                json.dump(state, f)
                f.flush()

    def _free_gpus(self, state: dict[str, Any]) -> int:
        return self._gpus_total - sum(i["gpus"] for i in state["instances"].values())

    # -- Provider ------------------------------------------------------------------

    def offers(self) -> list[Offer]:
        with self._state() as state:
            free = self._free_gpus(state)
        price = self._price
        return [
            Offer(
                provider=self.kind,
                gpu_type=self._gpu_type,
                gpus_per_instance=n,
                gpu_memory_mib=self._gpu_memory_mib,
                instance_type=f"local-{n}gpu",
                region=self._region,
                zone=None,
                on_demand_price=price * n,
                spot_price=round(price * n * 0.4, 6),
                available=free >= n,
            )
            for n in (1, 2, 4, 8)
            if n <= self._gpus_total
        ]

    def create_instances(self, pool: PoolRef, count: int, idempotency_key: str) -> list[Instance]:
        check_idempotency_key(idempotency_key)
        check_count(count)
        with self._state() as state:
            instances = state["instances"]
            mine = [i for i in instances.values() if i["key"] == idempotency_key]
            if mine:
                return [self._instance(i) for i in mine]
            wanted = count * pool.gpus_per_instance
            if self._max_instances is not None and len(instances) + count > self._max_instances:
                raise QuotaExceeded(
                    f"local quota is {self._max_instances} instances and {len(instances)} are "
                    f"held; release some or raise max_instances"
                )
            free = self._free_gpus(state)
            if wanted > free:
                raise InsufficientCapacity(
                    f"pool {pool.name!r} needs {wanted} GPUs but this machine has {free} free "
                    f"of {self._gpus_total}; ask for fewer or raise gpus_total"
                )
            created = []
            for _ in range(count):
                record = {
                    "id": f"local-{uuid.uuid4().hex[:12]}",
                    "pool": pool.name,
                    "key": idempotency_key,
                    "instance_type": pool.instance_type,
                    "region": pool.region,
                    "purchase_type": str(pool.purchase_type),
                    "gpus": pool.gpus_per_instance,
                }
                instances[record["id"]] = record
                created.append(self._instance(record))
            return created

    def delete_instance(self, instance_id: str) -> None:
        with self._state() as state:
            state["instances"].pop(instance_id, None)
            state["notices"].pop(instance_id, None)

    def list_instances(self) -> list[Instance]:
        with self._state() as state:
            return [self._instance(i) for i in state["instances"].values()]

    def interruption_notices(self) -> list[InterruptionNotice]:
        with self._state() as state:
            return [
                InterruptionNotice(
                    instance_id=iid,
                    deadline=datetime.fromisoformat(n["deadline"]),
                    reason=n["reason"],
                )
                for iid, n in state["notices"].items()
                if iid in state["instances"]
            ]

    # -- test and development hooks ---------------------------------------------------

    def interrupt(self, instance_id: str, notice: timedelta = timedelta(minutes=2)) -> None:
        """Announce that `instance_id` will be taken back `notice` from now (spot)."""
        with self._state() as state:
            record = state["instances"].get(instance_id)
            if record is None:
                raise NotFound(f"no local instance {instance_id!r}; list_instances() shows ids")
            if record["purchase_type"] != PurchaseType.SPOT:
                raise InvalidRequest(
                    f"instance {instance_id!r} is not spot; only spot instances are interrupted"
                )
            deadline = self._clock() + notice
            state["notices"][instance_id] = {
                "deadline": deadline.isoformat(),
                "reason": "spot-interruption",
            }

    def _instance(self, record: dict[str, Any]) -> Instance:
        return Instance(
            id=record["id"],
            pool=record["pool"],
            idempotency_key=record["key"],
            instance_type=record["instance_type"],
            region=record["region"],
            zone=None,
            purchase_type=PurchaseType(record["purchase_type"]),
            gpus=record["gpus"],
            state=InstanceState.RUNNING,
            address="127.0.0.1",
        )
