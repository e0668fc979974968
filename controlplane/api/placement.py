"""Placement routes: the current placement, a what-if preview, and an on-demand re-plan."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Discriminator, Field, Tag

from controlplane.api.auth import Principal, require
from controlplane.api.context import read_scope, session_scope
from controlplane.api.jsonbody import JsonRoute
from controlplane.api.schemas import CurrentPlacement, PreviewOut, Replanned
from controlplane.errors import Conflict, InvalidSpec
from controlplane.services import placement as svc
from controlplane.services import what_if
from controlplane.services.spend import limits_from
from controlplane.specs import MAX_POOL_GPUS, MAX_REPLICAS, Role, Spec

CLUSTER_STATES = {"healthy": "healthy", "down": "offline", "cordoned": "draining"}


class ClusterWhatIf(Spec):  # strict like every spec: no bool for a number, no control characters
    kind: Literal["cluster"]
    name: Annotated[str, Field(max_length=63)]  # echoed in the answer when unknown
    state: Literal["healthy", "down", "cordoned"]


class PoolWhatIf(Spec):  # strict like every spec: no bool for a number, no control characters
    kind: Literal["pool"]
    name: Annotated[str, Field(max_length=63)]  # echoed in the answer when unknown
    gpus: int | None = Field(default=None, ge=0, le=MAX_POOL_GPUS, description="GPUs usable now")
    procurable_gpus: int | None = Field(default=None, ge=0, le=MAX_POOL_GPUS)
    removed: bool = Field(default=False, description="e.g. the reservation ends")


class DeploymentWhatIf(Spec):  # strict like every spec: no bool for a number, no control characters
    kind: Literal["deployment"]
    name: Annotated[str, Field(max_length=63)]  # echoed in the answer when unknown
    replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS, description="wanted replicas")
    min_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    priority: int | None = Field(default=None, ge=0, le=1000)


def _kind(value: Any) -> str | None:
    return value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)


Change = Annotated[
    Annotated[ClusterWhatIf, Tag("cluster")]
    | Annotated[PoolWhatIf, Tag("pool")]
    | Annotated[DeploymentWhatIf, Tag("deployment")],
    Discriminator(_kind),
]


MAX_PREVIEW_CHANGES = 256
"""Changes one preview may pretend (each rebuilds a list of the world's objects)."""


class Preview(Spec):  # strict like every spec: no bool for a number, no control characters
    # tagged by `kind`: a bad field is reported for its own kind only, not for all three
    changes: list[Change] = Field(
        min_length=1,
        max_length=MAX_PREVIEW_CHANGES,
        description="What to pretend, e.g. a cluster down or a reservation ending.",
    )


def _engine_change(
    i: int, change: ClusterWhatIf | PoolWhatIf | DeploymentWhatIf, world: svc.World
) -> dict[str, Any]:
    known = {"cluster": world.clusters, "pool": world.pools, "deployment": world.deployments}
    if change.name not in known[change.kind]:
        raise InvalidSpec.on(f"changes[{i}].name", f"no {change.kind} named '{change.name}'")
    if isinstance(change, ClusterWhatIf):
        return {
            "kind": "cluster",
            "name": change.name,
            "set": {"state": CLUSTER_STATES[change.state]},
        }
    if isinstance(change, PoolWhatIf):
        patch: dict[str, Any] = {
            "capacity_gpus": change.gpus,
            "procurable_gpus": change.procurable_gpus,
        }
        if change.removed:
            patch = {"capacity_gpus": 0, "procurable_gpus": 0}
        return {
            "kind": "pool",
            "name": change.name,
            "set": {k: v for k, v in patch.items() if v is not None},
        }
    patch = {
        "wanted_replicas": change.replicas,
        "min_replicas": change.min_replicas,
        "priority": change.priority,
    }
    return {
        "kind": "deployment",
        "name": change.name,
        "set": {k: v for k, v in patch.items() if v is not None},
    }


def engine_changes(body: Preview, world: svc.World) -> list[dict[str, Any]]:
    """The engine's form of a preview's changes; InvalidSpec names an unknown object."""
    return [_engine_change(i, c, world) for i, c in enumerate(body.changes)]


def placement_router() -> APIRouter:
    router = APIRouter(route_class=JsonRoute, prefix="/placement", tags=["placement"])

    @router.get(
        "",
        summary="The current placement, with reasons and cost per hour",
        response_model=CurrentPlacement,
    )
    def get_placement(
        request: Request, _: Principal = Depends(require(Role.viewer))
    ) -> JSONResponse:
        with read_scope(request) as session:
            return JSONResponse(svc.current(session))

    @router.post(
        "/preview",
        summary="What if: re-plan with pretend changes, save nothing",
        response_model=PreviewOut,
    )
    def preview(
        request: Request, body: Preview, _: Principal = Depends(require(Role.viewer))
    ) -> JSONResponse:
        with read_scope(request) as session:
            world = svc.load_world(session)
            return JSONResponse(what_if.preview(world, engine_changes(body, world)))

    @router.post(
        "/replan",
        summary="Re-plan now (normally Celery does it on changes and a timer)",
        response_model=Replanned,
    )
    def replan_now(
        request: Request, _: Principal = Depends(require(Role.operator))
    ) -> JSONResponse:
        with session_scope(request) as session:
            limits = limits_from(request.app.state.settings)
            done = svc.replan(session, reason="api", spend_limits=limits)
        if done is None:
            raise Conflict("another re-plan is running; retry in a moment")
        request.app.state.dispatch_procurement(done.actions)
        return JSONResponse(done.summary)

    return router
