"""One Terraform resource per API kind, all alike: create is POST, read is GET by id (404:
gone, so Terraform plans it again), update is PUT with If-Match on the generation the state
holds (a concurrent change is a 409 shown as such), delete is DELETE with If-Match."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tf import schema, types
from tf.iface import (
    CreateContext,
    DeleteContext,
    ImportContext,
    PlanContext,
    ReadContext,
    Resource,
    UpdateContext,
)
from tf.types import Unknown
from tf.utils import Diagnostics

from gpufleet_tf import fields, tfschema
from gpufleet_tf.client import ApiProblem, Client
from gpufleet_tf.kinds import KINDS, Kind

if TYPE_CHECKING:
    from gpufleet_tf.provider import GpufleetProvider

# What the state keeps that the API does not send back (secrets shown once, our own flags).
KEPT = ("token", "nats_credentials", "force_destroy")


def report(diags: Diagnostics, what: str, problem: ApiProblem, top_fields: set[str]) -> None:
    """The API's problem as Terraform diagnostics, on the attribute it names where it can."""
    if problem.errors:
        for e in problem.errors:
            top = e.field.split(".")[0].split("[")[0]
            top = "provider_name" if top == "provider" else top
            path = [top] if top in top_fields else None
            diags.add_error(f"{what}: {e.field}: {e.message}", problem.detail, path=path)
        return
    hint = ""
    if problem.status == 409 and "generation" in problem.detail:
        hint = (
            " It was changed by someone else since Terraform read it: run `terraform plan` "
            "again to see their change, then apply."
        )
    diags.add_error(f"{what}: {problem.title}", (problem.detail or problem.title) + hint)


class KindResource(Resource):
    """Subclassed once per kind; `KIND` says which."""

    KIND: Kind

    def __init__(self, provider: GpufleetProvider) -> None:
        self.provider = provider

    @classmethod
    def get_name(cls) -> str:
        return cls.KIND.resource

    @classmethod
    def get_schema(cls) -> schema.Schema:
        attrs, blocks = tfschema.schema_parts(cls.KIND.fields)
        attrs.append(
            schema.Attribute("id", types.String(), computed=True, description="Server id.")
        )
        attrs.append(
            schema.Attribute(
                "generation",
                types.Number(),
                computed=True,
                description="Bumped by the API when the spec changes; sent as If-Match.",
            )
        )
        if cls.KIND.force_delete:
            attrs.append(
                schema.Attribute(
                    "force_destroy",
                    types.Bool(),
                    optional=True,
                    description="Delete even while replicas run (`DELETE ?force=true`).",
                )
            )
        if cls.KIND.path == "clusters":
            attrs.append(
                schema.Attribute(
                    "nats_credentials",
                    types.Map(types.String()),
                    computed=True,
                    sensitive=True,
                    description="The agent's NATS login (user, password, inbox_prefix), shown "
                    "once by the API: known only to the state of the apply that created it "
                    "(null after an import).",
                )
            )
        if cls.KIND.path == "tokens":
            attrs.append(
                schema.Attribute(
                    "token",
                    types.String(),
                    computed=True,
                    sensitive=True,
                    description="The secret, known only to the apply that created it.",
                )
            )
            attrs.append(
                schema.Attribute("prefix", types.String(), computed=True, description="Its start.")
            )
        return schema.Schema(
            version=1, attributes=attrs, block_types=blocks, description=cls.KIND.description
        )

    # --- helpers --------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        return self.provider.client

    def _what(self, name: Any) -> str:
        return f"{self.KIND.kind} '{name}'"

    def _top(self) -> set[str]:
        return {f.name for f in self.KIND.fields}

    def _state(self, body: dict[str, Any], generation: int, prior: dict | None) -> dict:
        state = fields.read_fields(self.KIND.fields, body, prior)
        state["id"] = body["id"]
        state["generation"] = generation or body.get("generation")
        prior = prior or {}
        if self.KIND.force_delete:
            state["force_destroy"] = prior.get("force_destroy")
        if self.KIND.path == "clusters":
            creds = body.get("nats_credentials")
            state["nats_credentials"] = (
                {k: str(v) for k, v in creds.items()}
                if creds
                else _known(prior, "nats_credentials")
            )
        if self.KIND.path == "tokens":
            state["token"] = body.get("token") or _known(prior, "token")
            state["prefix"] = (body.get("status") or {}).get("prefix")
        return state

    # --- lifecycle ------------------------------------------------------------------------

    def plan(self, ctx: PlanContext, current: dict | None, planned: dict) -> dict:
        if current is not None and fields.changed(self.KIND.fields, current, planned):
            planned["generation"] = Unknown  # the API bumps it
        return planned

    def create(self, ctx: CreateContext, planned: dict) -> dict | None:
        body = fields.to_spec(self.KIND.fields, planned)
        try:
            answer, generation = self.client.request("POST", f"/{self.KIND.path}", body)
        except ApiProblem as problem:
            report(
                ctx.diagnostics, f"creating {self._what(planned.get('name'))}", problem, self._top()
            )
            return None
        return self._state(answer, generation, planned)

    def read(self, ctx: ReadContext, current: dict) -> dict | None:
        ref = current.get("id") or current.get("name")
        try:
            answer, generation = self.client.request("GET", f"/{self.KIND.path}/{ref}")
        except ApiProblem as problem:
            if problem.gone:
                return None  # deleted out of band: Terraform plans to create it again
            report(ctx.diagnostics, f"reading {self._what(current.get('name'))}", problem, set())
            return current
        return self._state(answer, generation, current)

    def update(self, ctx: UpdateContext, current: dict, planned: dict) -> dict | None:
        body = fields.to_spec(self.KIND.fields, planned)
        name = current["name"]
        try:
            answer, generation = self.client.request(
                "PUT", f"/{self.KIND.path}/{name}", body, if_match=_int(current.get("generation"))
            )
        except ApiProblem as problem:
            report(ctx.diagnostics, f"updating {self._what(name)}", problem, self._top())
            return current
        return self._state(answer, generation, planned)

    def delete(self, ctx: DeleteContext, current: dict) -> None:
        force = "?force=true" if current.get("force_destroy") else ""
        try:
            self.client.request(
                "DELETE",
                f"/{self.KIND.path}/{current['id']}{force}",
                if_match=_int(current.get("generation")),
            )
        except ApiProblem as problem:
            if problem.gone:
                return None
            what = f"deleting {self._what(current.get('name'))}"
            if problem.status == 409 and "generation" not in problem.detail:
                what += " (the API refuses: it is in use)"
            report(ctx.diagnostics, what, problem, set())
        return None

    def import_(self, ctx: ImportContext, id: str) -> dict | None:
        try:
            answer, generation = self.client.request("GET", f"/{self.KIND.path}/{id}")
        except ApiProblem as problem:
            report(
                ctx.diagnostics,
                f"importing {self.KIND.kind} '{id}' (a name or an id)",
                problem,
                set(),
            )
            return None
        state = self._state(answer, generation, None)
        return state


def _known(prior: dict, key: str) -> Any:
    value = prior.get(key)
    return None if value is Unknown else value


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def resource_classes() -> list[type[KindResource]]:
    return [type(f"{k.kind}Resource", (KindResource,), {"KIND": k}) for k in KINDS]
