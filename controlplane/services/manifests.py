"""Apply a list of manifests (API bodies plus `kind`) in dependency order, server side.

Used to load the demo fleet on first start; the CLI's `apply` does the same over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from controlplane.errors import InvalidSpec
from controlplane.services import inventory
from controlplane.services.resources import KIND_BY_NAME

APPLY_ORDER = (
    "provider",
    "gputype",
    "region",
    "pool",
    "cluster",
    "deployment",
    "token",
    "apiprice",
)


def kind_key(manifest: Mapping[str, Any]) -> str:
    raw = str(manifest.get("kind", "")).replace("-", "").replace("_", "").lower()
    if raw not in KIND_BY_NAME:
        raise InvalidSpec.on(
            "kind",
            f"unknown kind '{manifest.get('kind')}'; one of "
            + ", ".join(k.kind for k in KIND_BY_NAME.values()),
        )
    return raw


def apply_manifests(
    session: Session, manifests: Iterable[Mapping[str, Any]], actor: inventory.Actor
) -> list[inventory.WriteResult]:
    docs = sorted(manifests, key=lambda d: APPLY_ORDER.index(kind_key(d)))
    results = []
    for doc in docs:
        kind = KIND_BY_NAME[kind_key(doc)]
        body = {k: v for k, v in doc.items() if k != "kind"}
        spec = inventory.parse_spec(kind, body)
        results.append(inventory.replace(session, kind, body.get("name", ""), spec, actor))
    return results
