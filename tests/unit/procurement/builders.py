"""Small builders for the pure procurement core: pools, instance rows, provider listings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any

from controlplane.procurement.core import InstanceView, PoolView
from providers.base import Instance as ProviderInstance
from providers.base import InstanceState

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
_n = count()


def make_pool(id: str = "p", purchase: str = "on_demand", gpi: int = 8, **kw: Any) -> PoolView:
    fields = {"limit_gpus": None, "scale_down_delay_s": 300.0, "cluster_id": "c"} | kw
    return PoolView(id=id, purchase_type=purchase, gpus_per_instance=gpi, **fields)


def make_instance(
    pool: str = "p", state: str = "running", gpus: int = 8, **kw: Any
) -> InstanceView:
    n = next(_n)
    fields = {"health": "healthy", "created_at": NOW - timedelta(hours=1, seconds=n)} | kw
    return InstanceView(id=f"i{n}", pool_id=pool, state=state, gpus=gpus, **fields)


def make_row(state: str, changed_s_ago: float = 0.0, pool: str = "p", **kw: Any) -> InstanceView:
    """An instance row as the reconcile sweep loads it: with its key, provider id (for the
    states that have one) and the time of its last change."""
    n = next(_n)
    fields: dict[str, Any] = {
        "idempotency_key": f"key-{n}",
        "provider_instance_id": None if state == "requested" else f"pi-{n}",
        "updated_at": NOW - timedelta(seconds=changed_s_ago),
    } | kw
    return make_instance(pool=pool, state=state, **fields)


def listed_for(*rows: InstanceView, key_only: bool = False) -> list[ProviderInstance]:
    """What the provider lists for `rows`: their instances (by provider id, or for a row
    without one, a new instance launched for its key)."""
    return [
        ProviderInstance(
            id=(None if key_only else r.provider_instance_id) or f"made-for-{r.idempotency_key}",
            pool=r.pool_id,
            idempotency_key=r.idempotency_key,
            instance_type="local-8gpu",
            region="local",
            zone=None,
            purchase_type=None,
            gpus=r.gpus,
            state=InstanceState.RUNNING,
        )
        for r in rows
    ]
