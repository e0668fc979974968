"""Read-only views: where a deployment runs and what it costs, GPU types, offers, a cluster's
observed state. Lists of records are lists of string maps (tf has no object type)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tf import schema, types
from tf.iface import DataSource, ReadDataContext

from gpufleet_tf.client import ApiProblem, Client
from gpufleet_tf.resources import report

if TYPE_CHECKING:
    from gpufleet_tf.provider import GpufleetProvider

RECORDS = types.List(types.Map(types.String()))


def _strings(record: dict[str, Any]) -> dict[str, str]:
    return {
        k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in record.items()
    }


class _Base(DataSource):
    def __init__(self, provider: GpufleetProvider) -> None:
        self.provider = provider

    @property
    def client(self) -> Client:
        return self.provider.client


class PlacementData(_Base):
    @classmethod
    def get_name(cls) -> str:
        return "placement"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            description="Where a deployment runs and what it costs (GET /placement).",
            attributes=[
                schema.Attribute("deployment", types.String(), required=True),
                schema.Attribute("wanted_replicas", types.Number(), computed=True),
                schema.Attribute("placed_replicas", types.Number(), computed=True),
                schema.Attribute("cost_per_hour", types.String(), computed=True),
                schema.Attribute(
                    "assignments", RECORDS, computed=True, description="cluster, pool, replicas"
                ),
                schema.Attribute(
                    "unplaced", RECORDS, computed=True, description="replicas, constraint, reason"
                ),
            ],
        )

    def read(self, ctx: ReadDataContext, config: dict) -> dict | None:
        name = config["deployment"]
        try:
            current = self.client.get("/placement")
        except ApiProblem as problem:
            report(ctx.diagnostics, "reading the placement", problem, set())
            return None
        mine = current.get("deployments", {}).get(name)
        if not mine:  # `{}` for a deployment no re-plan has placed yet
            ctx.diagnostics.add_error(
                f"deployment '{name}' has no placement",
                "No such deployment, or it was created after the last re-plan; check the name "
                "(gpufleet get deployments) or apply again in a moment.",
                path=["deployment"],
            )
            return None
        return {
            "deployment": name,
            "wanted_replicas": mine.get("wanted_replicas", 0),
            "placed_replicas": mine.get("placed_replicas", 0),
            "cost_per_hour": str(mine.get("cost_per_hour", "0")),
            "assignments": [_strings(a) for a in mine.get("assignments", [])],
            "unplaced": [_strings(u) for u in mine.get("unplaced", [])],
        }


class GpuTypesData(_Base):
    @classmethod
    def get_name(cls) -> str:
        return "gpu_types"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            description="Every GPU type.",
            attributes=[
                schema.Attribute("names", types.List(types.String()), computed=True),
                schema.Attribute("memory_gib", types.Map(types.Number()), computed=True),
            ],
        )

    def read(self, ctx: ReadDataContext, config: dict) -> dict | None:
        try:
            items = self.client.list("gpu-types")
        except ApiProblem as problem:
            report(ctx.diagnostics, "listing GPU types", problem, set())
            return None
        items.sort(key=lambda g: g["name"])
        return {
            "names": [g["name"] for g in items],
            "memory_gib": {g["name"]: g["memory_gib"] for g in items},
        }


OFFER_KEYS = ("instance_type", "zone", "on_demand_price", "spot_price", "available")


class OffersData(_Base):
    @classmethod
    def get_name(cls) -> str:
        return "offers"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            description="Each pool's offer with its price, as procurement last read it from the "
            "provider (pool status `offer`); pools never priced by their provider are left out.",
            attributes=[
                schema.Attribute(
                    "provider_name",
                    types.String(),
                    optional=True,
                    description="a provider's name (`provider` is Terraform's own meta-argument "
                    "in a data block: it could not be set)",
                ),
                schema.Attribute("gpu_type", types.String(), optional=True),
                schema.Attribute("purchase_type", types.String(), optional=True),
                schema.Attribute(
                    "offers",
                    RECORDS,
                    computed=True,
                    description="pool, provider, region, gpu_type, purchase_type, "
                    "price_per_gpu_hour, " + ", ".join(OFFER_KEYS),
                ),
            ],
        )

    def read(self, ctx: ReadDataContext, config: dict) -> dict | None:
        asked = {
            "provider": "provider_name",
            "gpu_type": "gpu_type",
            "purchase_type": "purchase_type",
        }
        filters = {k: config[a] for k, a in asked.items() if config.get(a)}
        try:
            pools = self.client.list("pools")
        except ApiProblem as problem:
            report(ctx.diagnostics, "listing pools", problem, set())
            return None
        offers = []
        for pool in sorted(pools, key=lambda p: p["name"]):
            offer = (pool.get("status") or {}).get("offer")
            if not offer or any(pool.get(k) != v for k, v in filters.items()):
                continue
            record = {k: pool[k] for k in ("provider", "region", "gpu_type", "purchase_type")}
            record |= {"pool": pool["name"], "price_per_gpu_hour": pool["price_per_gpu_hour"]}
            record |= {k: offer.get(k) for k in OFFER_KEYS}
            offers.append(_strings(record))
        return {
            **{k: config.get(k) for k in ("provider_name", "gpu_type", "purchase_type")},
            "offers": offers,
        }


class ClusterData(_Base):
    @classmethod
    def get_name(cls) -> str:
        return "cluster"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        computed = [
            ("id", types.String()),
            ("region", types.String()),
            ("endpoint", types.String()),
            ("pools", types.List(types.String())),
            ("cordoned", types.Bool()),
            ("state", types.String()),
            ("agent_version", types.String()),
            ("last_heartbeat_at", types.String()),
            ("desired_generation", types.Number()),
            ("observed_generation", types.Number()),
        ]
        return schema.Schema(
            description="A cluster's observed state (its plane's heartbeats).",
            attributes=[schema.Attribute("name", types.String(), required=True)]
            + [schema.Attribute(n, t, computed=True) for n, t in computed],
        )

    def read(self, ctx: ReadDataContext, config: dict) -> dict | None:
        try:
            c = self.client.get(f"/clusters/{config['name']}")
        except ApiProblem as problem:
            report(ctx.diagnostics, f"reading cluster '{config['name']}'", problem, set())
            return None
        status = c.get("status") or {}
        return {
            "name": c["name"],
            "id": c["id"],
            "region": c["region"],
            "endpoint": c.get("endpoint"),
            "pools": c.get("pools", []),
            "cordoned": c.get("cordoned", False),
            **{
                k: status.get(k)
                for k in (
                    "state",
                    "agent_version",
                    "last_heartbeat_at",
                    "desired_generation",
                    "observed_generation",
                )
            },
        }


DATA_SOURCES: list[type[DataSource]] = [PlacementData, GpuTypesData, OffersData, ClusterData]
