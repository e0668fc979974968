"""Provider adapters built from `Provider` rows: kind + configuration named by `credentials_ref`.

`credentials_ref` names where the adapter's keyword arguments live, never the secret itself:
`env:NAME` (a JSON object in environment variable NAME), `file:/path` (a JSON file), or
`none:…` / unset (no configuration). Other schemes (vault:, aws-secretsmanager:, …) are
refused with what to use instead. A `local` provider keeps its state in
`<data_dir>/providers/<name>.json` unless its configuration names a `state_path`.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from controlplane.contracts import read_small_file
from controlplane.db.columns import pool_status
from controlplane.db.models import Pool
from controlplane.db.models import Provider as ProviderRow
from providers.base import InvalidRequest, PoolRef, Provider, PurchaseType
from providers.registry import create_provider

MAX_CREDENTIALS_BYTES = 256 * 1024
"""Largest credentials file read (a service-account key is ~2.5 KiB)."""


def provider_config(row: ProviderRow, data_dir: Path) -> dict[str, Any]:
    """The adapter's keyword arguments for `row`."""
    ref = row.credentials_ref or "none:"
    scheme, _, where = ref.partition(":")
    if scheme == "env":
        raw = os.environ.get(where)
        if raw is None:
            raise InvalidRequest(
                f"provider {row.name!r}: credentials_ref {ref!r} names environment variable "
                f"{where!r}, which is not set; set it to a JSON object of adapter settings"
            )
    elif scheme == "file":
        try:
            data = read_small_file(Path(where), MAX_CREDENTIALS_BYTES)
        except OSError as exc:
            raise InvalidRequest(
                f"provider {row.name!r}: cannot read {where!r} ({exc.strerror}); "
                "point credentials_ref at a readable JSON file"
            ) from exc
        if len(data) > MAX_CREDENTIALS_BYTES:
            raise InvalidRequest(
                f"provider {row.name!r}: {where!r} is over {MAX_CREDENTIALS_BYTES} bytes; "
                "point credentials_ref at a JSON object of adapter settings"
            )
        raw = data.decode("utf-8", errors="replace")
    elif scheme == "none":
        raw = "{}"
    else:
        raise InvalidRequest(
            f"provider {row.name!r}: credentials_ref scheme {scheme!r} is not read by this "
            "version; use env:NAME or file:/path holding a JSON object"
        )
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"provider {row.name!r}: the configuration at {ref!r} is not JSON ({exc.msg}); "
            "write a JSON object of adapter settings"
        ) from exc
    if not isinstance(config, dict):
        raise InvalidRequest(
            f"provider {row.name!r}: the configuration at {ref!r} must be a JSON object"
        )
    if row.kind == "local":
        config.setdefault("state_path", str(data_dir / "providers" / f"{row.name}.json"))
    return config


def build_provider(row: ProviderRow, data_dir: Path) -> Provider:
    return create_provider(row.kind, **provider_config(row, data_dir))


class ProviderCache:
    """One adapter per provider and spec generation in this process (clients are reused)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._lock = threading.Lock()
        self._built: dict[tuple[str, int], Provider] = {}

    def __call__(self, row: ProviderRow) -> Provider:
        key = (row.id, row.generation)
        with self._lock:
            if key not in self._built:
                for old in [k for k in self._built if k[0] == row.id]:
                    del self._built[old]  # an older generation's client is never used again
                self._built[key] = build_provider(row, self._data_dir)
            return self._built[key]


def pool_ref(pool: Pool) -> PoolRef:
    """Where and how to buy for `pool` (instance type and zone from the refreshed offer when
    the pool does not name them)."""
    offer = pool_status(pool).offer
    instance_type = pool.instance_type or (offer.instance_type if offer else None)
    if instance_type is None and pool.provider.kind == "local":
        instance_type = f"local-{pool.gpus_per_instance}gpu"
    if instance_type is None:
        raise InvalidRequest(
            f"pool {pool.name!r} has no instance_type; set it to the "
            "provider's instance type for this GPU shape"
        )
    return PoolRef(
        name=pool.name,
        region=pool.region.code,
        zone=offer.zone if offer and pool.instance_type in (None, offer.instance_type) else None,
        gpu_type=pool.gpu_type.name,
        instance_type=instance_type,
        purchase_type=PurchaseType(pool.purchase_type),
        gpus_per_instance=pool.gpus_per_instance,
        capacity_reservation_id=pool.capacity_reservation_id,
    )
