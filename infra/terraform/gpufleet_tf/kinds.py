"""Every kind the admin API writes, as Terraform sees it: the API's path and spec fields
(controlplane/specs.py, the same names as the API and the CLI's manifests)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet_tf.fields import Field

NAME = Field("name", "string", required=True, replace=True, description="Unique name.")
PROVIDER_NAME = Field(
    "provider_name",
    "string",
    required=True,
    api_name="provider",
    description="The provider's name: the API's `provider` (a name Terraform reserves).",
)


@dataclass(frozen=True)
class Kind:
    resource: str  # Terraform type without the `gpufleet_` prefix
    kind: str  # the API's kind
    path: str  # under /api/v1
    fields: tuple[Field, ...]
    description: str
    force_delete: bool = False  # has `force_destroy` (DELETE ?force=true)


SCHEDULE = Field(
    "schedule",
    "block",
    many=True,
    default=[],
    description="Windows that raise min_replicas by time of day.",
    children=(
        Field("days", "list", element="int", default=[0, 1, 2, 3, 4], description="0 = Monday."),
        Field("start", "string", required=True, description="HH:MM"),
        Field("end", "string", required=True, description="HH:MM"),
        Field("timezone", "string", default="UTC"),
        Field("min_replicas", "int", required=True),
    ),
)

AUTOSCALING = Field(
    "autoscaling",
    "block",
    description="Each plane's autoscaler (docs/api.md, Deployment knobs).",
    children=(
        Field("min_replicas", "int", default=1),
        Field("max_replicas", "int", default=1),
        Field("window_seconds", "number", default=60),
        Field("scale_down_delay_seconds", "number", default=300),
        Field("target_concurrency", "number", default=8),
        Field("scale_to_zero_idle_seconds", "number", default=300),
        SCHEDULE,
    ),
)

PLACEMENT = Field(
    "placement",
    "block",
    description="Where replicas may go (docs/api.md, Deployment knobs).",
    children=(
        Field("allowed_jurisdictions", "set", default=[], description="ISO 3166-1 alpha-2."),
        Field("allowed_regions", "set", default=[]),
        Field("required_certifications", "set", default=[]),
        Field("spot_allowed", "bool", default=False),
        Field("max_spot_fraction", "number", default=0.5),
        Field("min_distinct_providers", "int", default=1),
        Field("min_distinct_regions", "int", default=1),
    ),
)

FAILOVER = Field(
    "failover",
    "block",
    description="How the gateways fail over between planes (docs/gateway.md).",
    children=(
        Field(
            "mode", "string", default="active_active", description="active_active, active_passive."
        ),
        Field("standby_cluster", "string", description="active_passive: keeps the standby warm."),
        Field("standby_replicas", "int", default=1),
        Field("hold_down_seconds", "number", default=30),
    ),
)

ROLLOUT = Field(
    "rollout",
    "block",
    description="How a new revision reaches the replicas (docs/rollouts.md).",
    children=(
        Field("strategy", "string", default="canary", description="canary, blue_green, immediate."),
        Field(
            "steps",
            "list",
            element="number",
            default=[0.05, 0.25, 0.5, 1.0],
            description="canary: the new revision's share at each step, ending at 1.0.",
        ),
        Field("hold_seconds", "number", default=300),
        Field(
            "keep_seconds",
            "number",
            default=600,
            description="blue_green: the old revision kept at full size after the switch.",
        ),
        Field(
            "gates",
            "block",
            description="canary, blue_green: what the new revision must show against the stable.",
            children=(
                Field("min_requests", "int", default=100),
                Field("max_error_rate_increase", "number", default=0.01),
                Field("max_p99_ttft_ratio", "number", default=1.5),
                Field("max_p99_e2e_ratio", "number", default=1.5),
            ),
        ),
    ),
)

SHADOW = Field(
    "shadow",
    "block",
    description="A shadow revision mirrored a share of the requests, its answers discarded "
    "(docs/rollouts.md#shadow-traffic); no block: no shadow.",
    children=(
        Field("share", "number", required=True, description="The share of requests copied."),
        Field("replicas", "int", default=1, description="Per cluster the deployment is on."),
        Field("model_id", "string", description="Unset: the deployment's."),
        Field("model_revision", "string", description="Unset: the deployment's."),
        Field("engine_image", "string", description="Unset: the deployment's."),
        Field("engine_args", "list", description="Unset: the deployment's; set: these instead."),
    ),
)

KINDS: tuple[Kind, ...] = (
    Kind(
        "provider",
        "Provider",
        "providers",
        (
            NAME,
            Field("provider_kind", "string", required=True, description="aws, gcp, lambda, …"),
            Field("provider_class", "string", required=True),
            Field("certifications", "set", default=[]),
            Field(
                "credentials_ref", "string", description="A reference (env:NAME…), never a secret."
            ),
            Field("labels", "map_string", default={}),
        ),
        "A cloud account.",
    ),
    Kind(
        "region",
        "Region",
        "regions",
        (
            NAME,
            PROVIDER_NAME,
            Field("code", "string", required=True),
            Field("jurisdiction", "string", required=True, description="ISO 3166-1 alpha-2."),
            Field("latitude", "number", required=True),
            Field("longitude", "number", required=True),
        ),
        "A provider's region.",
    ),
    Kind(
        "gpu_type",
        "GpuType",
        "gpu-types",
        (NAME, Field("memory_gib", "int", required=True)),
        "A GPU type.",
    ),
    Kind(
        "pool",
        "Pool",
        "pools",
        (
            NAME,
            PROVIDER_NAME,
            Field("region", "string", required=True),
            Field("gpu_type", "string", required=True),
            Field(
                "purchase_type", "string", required=True, description="reserved, on_demand, spot."
            ),
            Field("gpus", "int", required=True),
            Field("gpus_per_instance", "int", default=8),
            Field("instance_type", "string"),
            Field("price_per_gpu_hour", "decimal", required=True, description="A decimal string."),
            Field("term_start", "datetime", description="Reserved: RFC 3339."),
            Field("term_end", "datetime", description="Reserved: RFC 3339."),
            Field("committed_gpus", "int", description="Reserved."),
            Field("capacity_reservation_id", "string", description="Reserved."),
            Field("quota_gpus", "int", description="On-demand."),
            Field("interruptions_per_hour", "decimal", description="Spot."),
            Field("notice_seconds", "int", description="Spot."),
        ),
        "GPUs of one type in one region of one provider, bought one way.",
    ),
    Kind(
        "cluster",
        "Cluster",
        "clusters",
        (
            NAME,
            Field("region", "string", required=True),
            Field("endpoint", "url"),
            Field("pools", "set", default=[]),
            Field("cordoned", "bool", default=False),
        ),
        "A workload plane. Its NATS credentials are generated at creation and shown once: they "
        "are in `nats_credentials` (sensitive) in the state of the apply that created it.",
        force_delete=True,
    ),
    Kind(
        "deployment",
        "Deployment",
        "deployments",
        (
            NAME,
            Field("model_id", "string", required=True),
            Field("model_revision", "string", default="main"),
            Field("engine_image", "string", default="vllm/vllm-openai:v0.32.0"),
            Field("engine_args", "list", default=[]),
            Field("gpus_per_replica", "int", required=True),
            Field("gpu_types", "set", required=True),
            Field("priority", "int", default=100),
            Field("traffic", "map_number", default={}, description="Region name → weight."),
            AUTOSCALING,
            PLACEMENT,
            FAILOVER,
            ROLLOUT,
            SHADOW,
        ),
        "A model served by vLLM.",
        force_delete=True,
    ),
    Kind(
        "token",
        "Token",
        "tokens",
        (
            NAME,
            Field("role", "string", required=True, description="viewer, operator or admin."),
            Field("description", "string"),
            Field("expires_at", "datetime"),
        ),
        "An API token; the secret (`token`, sensitive) is known only in the apply that created it.",
    ),
)
