"""The specs users write (API bodies, CLI YAML, Terraform): references are by name.

Domain, not HTTP: services, the CLI and the API all validate with these models. A spec is
what the user owns; `generation` changes only when it changes. Status is ours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from itertools import pairwise
from typing import Annotated, Any, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    AliasChoices,
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    UrlConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema

from controlplane import spec_values
from controlplane.jurisdictions import ISO_3166_ALPHA2, is_jurisdiction

# Size limits (docs/api.md, "Limits"): roomy for a demanding fleet, small enough that no one
# object can crowd its cluster's desired-state snapshot out of one NATS message (1 MiB).
MAX_TEXT = 255
"""Free-text references (model ids, images, credentials refs): their columns' width."""
MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE = 64, 128, 256
MAX_ENGINE_ARGS, MAX_ENGINE_ARG, MAX_ENGINE_ARGS_BYTES = 256, 4096, 32 * 1024
MAX_NAMES = 256
"""Lists and maps of names (a cluster's pools, allowed regions, traffic sources)."""
MAX_POOL_GPUS = 1_000_000  # more than any region holds; beyond it a count is a mistake
MAX_NOTICE_SECONDS = 7 * 86_400
MAX_IDLE_SECONDS = 30 * 86_400  # scale to zero after a month idle at most
MAX_WEIGHT = 1e6
"""A traffic weight (relative): larger ones overflowed the sum and were silently ignored."""
MAX_REPLICAS = 10_000  # as a replica quota (controlplane.contracts.REPLICAS_MAX)
MAX_GPU_TYPES, MAX_CERTIFICATIONS, MAX_SCHEDULE_WINDOWS = 32, 32, 64


def _not_an_id(v: str) -> str:
    if spec_values.is_canonical_uuid(v):
        raise ValueError(
            "has the form of an object id (8-4-4-4-12 hex digits), and a path takes either: "
            "choose a name of another form"
        )
    return v


Name = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", max_length=63),
    AfterValidator(_not_an_id),
    Field(
        description="Lowercase letters, digits and '-', at most 63 characters, not of an "
        "id's form (8-4-4-4-12 hex digits)."
    ),
]
GpuTypeName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"),
    AfterValidator(_not_an_id),
]
Certification = Annotated[str, StringConstraints(pattern=r"^[A-Z0-9][A-Z0-9-]{1,31}$")]
Jurisdiction = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Z]{2}$"),
    # the document lists the codes the validator below accepts, so clients agree with it
    WithJsonSchema({"type": "string", "enum": sorted(ISO_3166_ALPHA2)}),
]
CREDENTIALS_REF = r"^(env|file|vault|aws-secretsmanager|gcp-secretmanager|k8s-secret|none):\S+$"
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL_KEY)]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE)]
EngineArg = Annotated[str, StringConstraints(max_length=MAX_ENGINE_ARG)]


def stored_decimal(v: Decimal) -> Decimal:
    """``v`` as NUMERIC(…, 6) stores it: six places, and no negative zero (PostgreSQL has
    none: "-0" would read back as "0", and every repeated PUT would count as a change)."""
    v = v.quantize(Decimal("0.000001"))
    return v.copy_abs() if v.is_zero() else v


def _text(max_length: int = MAX_TEXT) -> Any:
    return StringConstraints(max_length=max_length)


def _utc_in_range(v: datetime) -> datetime:
    """A time as stored: in UTC (a time without an offset is read as UTC), within years
    1970-2999 (PostgreSQL stores year 10000 but cannot read it back: a row nothing could
    read, change or delete)."""
    try:
        v = v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 across the offset
        v = datetime.min.replace(tzinfo=UTC)
    if not 1970 <= v.year <= 2999:
        raise ValueError("must be between 1970 and 2999 (UTC); fix the year")
    return v


When = Annotated[datetime, AfterValidator(_utc_in_range)]
"""A point in time in a spec: UTC, 1970-2999."""


class Spec(BaseModel):
    # no Infinity/NaN (Python's JSON reads them; PostgreSQL's jsonb and JSON itself do not)
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(str(info.field_name))
        if field is not None and spec_values.bool_for_number(field.annotation, v):
            raise ValueError("must be a number, not true/false")
        return v

    @field_validator("*", mode="before")
    @classmethod
    def _keys_distinct_once_stripped(cls, v: Any) -> Any:
        # surrounding spaces are stripped from keys too: "team" and "team " would merge
        if isinstance(v, dict) and len(v) > 1:
            seen: set[str] = set()
            for key in v:
                if isinstance(key, str):
                    bare = key.strip()
                    if bare in seen:
                        raise ValueError(
                            f"has the key {bare[:64]!r} twice once surrounding spaces are "
                            "removed; keep one"
                        )
                    seen.add(bare)
        return v

    @field_validator("*")
    @classmethod
    def _no_control_characters(cls, v: Any) -> Any:
        if char := spec_values.control_character(v):
            raise ValueError(f"contains the control character U+{ord(char):04X}; remove it")
        return v


def _check_jurisdictions(codes: list[str]) -> list[str]:
    for code in codes:
        if not is_jurisdiction(code):
            raise ValueError(
                f"'{code}' is not an ISO 3166-1 alpha-2 country code; use e.g. US, DE, JP"
            )
    return codes


class ProviderKind(StrEnum):
    aws = "aws"
    gcp = "gcp"
    azure = "azure"
    coreweave = "coreweave"
    nebius = "nebius"
    lambda_ = "lambda"
    local = "local"
    other = "other"


class ProviderClass(StrEnum):
    hyperscaler = "hyperscaler"
    neocloud = "neocloud"
    reseller = "reseller"


class ProviderSpec(Spec):
    name: Name
    provider_kind: ProviderKind = Field(
        description="Which cloud (aws, gcp, lambda, local…). Not `kind`: that names the object "
        "type in manifests and responses (kind: Provider)."
    )
    provider_class: ProviderClass
    certifications: list[Certification] = Field(default_factory=list, max_length=MAX_CERTIFICATIONS)
    credentials_ref: (
        Annotated[str, StringConstraints(pattern=CREDENTIALS_REF, max_length=MAX_TEXT)] | None
    ) = Field(
        default=None,
        description="Where the credentials live, never the secret: env:NAME, file:/path, "
        "vault:path, aws-secretsmanager:arn, gcp-secretmanager:name, k8s-secret:ns/name.",
    )
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)

    @field_validator("certifications")
    @classmethod
    def _sorted_unique(cls, v: list[str]) -> list[str]:
        return sorted(set(v))


class RegionSpec(Spec):
    name: Name
    provider: Name
    code: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    jurisdiction: Jurisdiction = Field(
        description="ISO 3166-1 alpha-2 country code where the region's data lives."
    )
    latitude: float = Field(ge=-90, le=90)
    longitude: float = Field(ge=-180, le=180)

    @field_validator("jurisdiction")
    @classmethod
    def _iso(cls, v: str) -> str:
        _check_jurisdictions([v])
        return v


class GpuTypeSpec(Spec):
    name: GpuTypeName
    memory_gib: int = Field(gt=0, le=4096)


class PurchaseType(StrEnum):
    reserved = "reserved"
    on_demand = "on_demand"
    spot = "spot"


_ONLY_FOR: dict[str, PurchaseType] = {
    "term_start": PurchaseType.reserved,
    "term_end": PurchaseType.reserved,
    "committed_gpus": PurchaseType.reserved,
    "capacity_reservation_id": PurchaseType.reserved,
    "quota_gpus": PurchaseType.on_demand,
    "interruptions_per_hour": PurchaseType.spot,
    "notice_seconds": PurchaseType.spot,
}


class PoolSpec(Spec):
    name: Name
    provider: Name
    region: Name
    gpu_type: GpuTypeName
    purchase_type: PurchaseType
    gpus: int = Field(
        ge=0, le=MAX_POOL_GPUS, description="GPUs in the pool now (held or immediately usable)."
    )
    gpus_per_instance: int = Field(default=8, ge=1, le=64)
    instance_type: Annotated[str, _text(63)] | None = None
    price_per_gpu_hour: Decimal = Field(ge=0, max_digits=14, decimal_places=6)
    term_start: When | None = None
    term_end: When | None = None
    committed_gpus: int | None = Field(default=None, ge=0, le=MAX_POOL_GPUS)
    capacity_reservation_id: Annotated[str, _text(128)] | None = None
    quota_gpus: int | None = Field(default=None, ge=0, le=MAX_POOL_GPUS)
    interruptions_per_hour: Decimal | None = Field(
        default=None, ge=0, le=Decimal("9999.999999"), max_digits=10
    )
    notice_seconds: int | None = Field(default=None, ge=0, le=MAX_NOTICE_SECONDS)

    @field_validator("price_per_gpu_hour", "interruptions_per_hour")
    @classmethod
    def _exact(cls, v: Decimal | None) -> Decimal | None:
        # stored as NUMERIC(…, 6): normalise so that "2.1" and "2.100000" are the same spec
        return None if v is None else stored_decimal(v)

    @field_validator(*_ONLY_FOR)
    @classmethod
    def _only_for_its_purchase_type(cls, v: object, info: ValidationInfo) -> object:
        only = _ONLY_FOR[str(info.field_name)]
        if v is not None and info.data.get("purchase_type") not in (None, only):
            raise ValueError(
                f"applies to {only.value} pools only; remove it or set purchase_type: {only.value}"
            )
        return v

    @field_validator("term_end")
    @classmethod
    def _after_start(cls, v: datetime | None, info: ValidationInfo) -> datetime | None:
        start = info.data.get("term_start")
        if v is not None and start is not None and v <= start:
            raise ValueError(f"must be after term_start ({start.isoformat()}); fix one of them")
        return v

    @model_validator(mode="after")
    def _reserved_terms(self) -> Self:
        if self.purchase_type == PurchaseType.reserved:
            missing = [
                f for f in ("term_start", "term_end", "committed_gpus") if getattr(self, f) is None
            ]
            if missing:
                raise ValueError(
                    f"a reserved pool needs {', '.join(missing)} (the contract's term and the "
                    "GPUs paid for); add them"
                )
        return self


class ClusterSpec(Spec):
    name: Name
    region: Name
    endpoint: Annotated[AnyHttpUrl, UrlConstraints(max_length=MAX_TEXT)] | None = None
    pools: list[Name] = Field(
        default_factory=list, max_length=MAX_NAMES, description="Pools this cluster may draw on."
    )
    cordoned: bool = Field(default=False, description="True: receives no new replicas.")

    @field_validator("pools")
    @classmethod
    def _sorted_unique(cls, v: list[str]) -> list[str]:
        return sorted(set(v))

    @field_validator("endpoint")
    @classmethod
    def _plain_endpoint(cls, v: AnyHttpUrl | None) -> AnyHttpUrl | None:
        """The router's base URL: scheme, host, port and path only. The dashboard appends
        `/v1/…` and `/metrics` to it for viewers, so a query (`…?x=`, which turned the
        appended path into a parameter), a fragment or user:password let an operator point
        viewers' requests at any internal URL."""
        if v is not None and ("?" in str(v) or "#" in str(v) or v.username or v.password):
            raise ValueError(
                "give the router's base URL only (scheme, host, port, path): no query, "
                "fragment or user:password"
            )
        if v is not None and len(str(v)) > MAX_TEXT:  # quoting may lengthen what was short
            raise ValueError(f"is {len(str(v))} characters once URL-quoted; at most {MAX_TEXT}")
        return v


class ScheduleEntry(Spec):
    days: list[Annotated[int, Field(ge=0, le=6)]] = Field(
        default_factory=lambda: [0, 1, 2, 3, 4], max_length=7, description="0 = Monday."
    )
    start: Annotated[str, StringConstraints(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]
    end: Annotated[str, StringConstraints(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]
    timezone: Annotated[str, _text(64)] = "UTC"
    min_replicas: int = Field(ge=0, le=MAX_REPLICAS)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        """An IANA zone the agents can read (one they cannot was skipped with a log line)."""
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"'{v:.64}' is not an IANA time zone; use e.g. UTC, Europe/Berlin, America/New_York"
            ) from None
        return v


def _was(name: str, old: str) -> AliasChoices:
    """Accept `old`, the spelling before one word per concept, as a deprecated alias."""
    return AliasChoices(name, old)


def _one_spelling(data: Any, deprecated: Mapping[str, str]) -> Any:
    if isinstance(data, Mapping):
        for old, new in deprecated.items():
            if old in data and new in data:
                raise ValueError(f"send only `{new}`: `{old}` is its deprecated spelling")
    return data


AUTOSCALING_DEPRECATED = {
    "window_s": "window_seconds",
    "scale_down_delay_s": "scale_down_delay_seconds",
    "concurrency_target": "target_concurrency",
    "scale_to_zero_idle_s": "scale_to_zero_idle_seconds",
}
PLACEMENT_DEPRECATED = {
    "min_providers": "min_distinct_providers",
    "min_regions": "min_distinct_regions",
}


class AutoscalingSpec(Spec):
    """The knobs of each plane's autoscaler, spelled and defaulted as in the contract
    (`contracts.AutoscalingPolicy`) that carries them to the agent."""

    min_replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    window_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        validation_alias=_was("window_seconds", "window_s"),
        description="Load is averaged over this window. Deprecated alias: window_s.",
    )
    scale_down_delay_seconds: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        validation_alias=_was("scale_down_delay_seconds", "scale_down_delay_s"),
        description="A lower count must hold this long before replicas are removed. "
        "Deprecated alias: scale_down_delay_s.",
    )
    target_concurrency: float = Field(
        default=8.0,
        gt=0,
        le=10_000,
        validation_alias=_was("target_concurrency", "concurrency_target"),
        description="Requests in flight per replica the autoscaler aims at; also the "
        "router's per-replica limit. Deprecated alias: concurrency_target.",
    )
    scale_to_zero_idle_seconds: float = Field(
        default=300.0,
        ge=0,
        le=MAX_IDLE_SECONDS,
        validation_alias=_was("scale_to_zero_idle_seconds", "scale_to_zero_idle_s"),
        description="With min_replicas 0: no load for this long scales to zero. "
        "Deprecated alias: scale_to_zero_idle_s.",
    )
    schedule: list[ScheduleEntry] = Field(default_factory=list, max_length=MAX_SCHEDULE_WINDOWS)

    @model_validator(mode="before")
    @classmethod
    def _not_both_spellings(cls, data: Any) -> Any:
        return _one_spelling(data, AUTOSCALING_DEPRECATED)

    @field_validator("max_replicas")
    @classmethod
    def _not_below_min(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_replicas")
        if low is not None and v < low:
            raise ValueError(
                f"max_replicas ({v}) is below min_replicas ({low}); raise max_replicas or lower "
                "min_replicas"
            )
        return v


class PlacementSpec(Spec):
    allowed_jurisdictions: list[Jurisdiction] = Field(
        default_factory=list, max_length=MAX_NAMES, description="ISO 3166 codes; empty: anywhere."
    )
    allowed_regions: list[Name] = Field(
        default_factory=list, max_length=MAX_NAMES, description="Empty: any region."
    )
    required_certifications: list[Certification] = Field(
        default_factory=list, max_length=MAX_CERTIFICATIONS
    )
    spot_allowed: bool = False
    max_spot_fraction: float = Field(default=0.5, ge=0, le=1)
    min_distinct_providers: int = Field(
        default=1,
        ge=1,
        le=16,
        validation_alias=_was("min_distinct_providers", "min_providers"),
        description="Spread replicas over at least this many providers. "
        "Deprecated alias: min_providers.",
    )
    min_distinct_regions: int = Field(
        default=1,
        ge=1,
        le=64,
        validation_alias=_was("min_distinct_regions", "min_regions"),
        description="Spread replicas over at least this many regions. "
        "Deprecated alias: min_regions.",
    )

    @model_validator(mode="before")
    @classmethod
    def _not_both_spellings(cls, data: Any) -> Any:
        return _one_spelling(data, PLACEMENT_DEPRECATED)

    @field_validator("allowed_jurisdictions")
    @classmethod
    def _iso(cls, v: list[str]) -> list[str]:
        return sorted(set(_check_jurisdictions(v)))

    @field_validator("allowed_regions", "required_certifications")
    @classmethod
    def _sorted_unique(cls, v: list[str]) -> list[str]:
        return sorted(set(v))


class FailoverMode(StrEnum):
    active_active = "active_active"
    active_passive = "active_passive"


MAX_STANDBY_REPLICAS = 64
MAX_HOLD_DOWN_SECONDS = 86_400.0


class FailoverSpec(Spec):
    """How the gateways fail a deployment over between planes (docs/gateway.md).

    ``active_active``: every plane that carries replicas serves. ``active_passive``:
    ``standby_cluster`` keeps ``standby_replicas`` warm (placed and priced like any replica,
    never scaled away) and gets traffic only when no active plane can serve; traffic moves
    back once the primary has been healthy for ``hold_down_seconds``. Under
    ``active_active`` the standby fields are kept but unused (switching modes is one field).
    """

    mode: FailoverMode = FailoverMode.active_active
    standby_cluster: Name | None = Field(
        default=None,
        description="active_passive: the cluster that keeps the standby warm (kept, unused, "
        "under active_active)",
    )
    standby_replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_STANDBY_REPLICAS,
        description="active_passive: replicas kept warm on the standby cluster",
    )
    hold_down_seconds: float = Field(
        default=30.0,
        ge=0,
        le=MAX_HOLD_DOWN_SECONDS,
        description="active_passive: the primary is healthy this long before traffic returns",
    )

    @model_validator(mode="after")
    def _standby_for_active_passive(self) -> Self:
        if self.mode == FailoverMode.active_passive and self.standby_cluster is None:
            raise ValueError(
                "active_passive needs standby_cluster (the cluster that keeps the deployment "
                "warm); name one or use mode: active_active"
            )
        return self

    @property
    def standby(self) -> str | None:
        """The standby cluster when the mode is active_passive, else None."""
        return self.standby_cluster if self.mode == FailoverMode.active_passive else None


class RolloutStrategy(StrEnum):
    canary = "canary"
    blue_green = "blue_green"
    immediate = "immediate"


MAX_ROLLOUT_STEPS = 16
LANE_NAME = r".+--r[0-9]+"
"""A rollout lane's entry name (`controlplane.rollouts.lane_name`): no deployment's."""
MAX_HOLD_SECONDS = 86_400.0
MAX_KEEP_SECONDS = 7 * 86_400.0


class GatesSpec(Spec):
    """What a canary step must show, over the same window as the stable revision, before
    traffic moves on (docs/rollouts.md; `controlplane.rollouts.Gates`)."""

    min_requests: int = Field(
        default=100, ge=1, le=1_000_000, description="on each revision before a gate may pass"
    )
    max_error_rate_increase: float = Field(
        default=0.01, ge=0, le=1, description="absolute: the stable error rate + this at most"
    )
    max_p99_ttft_ratio: float = Field(
        default=1.5, ge=1, le=100, description="p99 time to first token, × the stable one's"
    )
    max_p99_e2e_ratio: float = Field(
        default=1.5, ge=1, le=100, description="p99 end-to-end latency, × the stable one's"
    )


class RolloutSpec(Spec):
    """How a change of the revision fields (`REVISION_FIELDS`) reaches the replicas.

    ``canary`` (the default): the new revision runs beside the stable one as a rollout lane
    and takes ``steps`` of the traffic, each held ``hold_seconds`` and judged by ``gates``; a
    step with next to no traffic (under ``gates.min_requests`` on both revisions together)
    passes when its hold is over. ``blue_green``: the new revision is brought up at full size
    beside the stable one, takes all the traffic at once when its replicas are ready, and the
    stable one is kept at full size ``keep_seconds`` (watched by ``gates``) for an instant
    rollback. ``immediate``: every plane replaces its replicas at once, make before break
    (a deployment placed nowhere, or a new one, always starts this way)."""

    strategy: RolloutStrategy = RolloutStrategy.canary
    steps: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [0.05, 0.25, 0.5, 1.0],
        min_length=1,
        max_length=MAX_ROLLOUT_STEPS,
        description="the new revision's share of traffic at each step, rising, ending at 1.0",
    )
    hold_seconds: float = Field(default=300.0, ge=0, le=MAX_HOLD_SECONDS)
    keep_seconds: float = Field(
        default=600.0,
        ge=0,
        le=MAX_KEEP_SECONDS,
        description="blue_green: how long the old revision stays at full size after the "
        "switch, for an instant rollback",
    )
    gates: GatesSpec = Field(default_factory=GatesSpec)

    @field_validator("steps")
    @classmethod
    def _rising_to_all(cls, v: list[float]) -> list[float]:
        if any(b <= a for a, b in pairwise(v)):
            raise ValueError(f"must rise step by step (got {v}); sort them and drop repeats")
        if v[-1] != 1.0:
            raise ValueError(f"must end at 1.0 (all traffic), not {v[-1]}; append 1.0")
        return v


SHADOW_SUFFIX = "--shadow"
"""A shadow lane's entry is `NAME--shadow` (`controlplane.shadows.shadow_name`): no
deployment's name ends so."""
MAX_SHADOW_REPLICAS = 64


PROMPT_LOGGING = ("--enable-log-requests", "--enable-log-outputs")
"""vLLM flags that write prompts or completions to the engine's log: never stored or logged."""


def checked_engine_args(args: list[str]) -> list[str]:
    """Engine arguments that fit a snapshot and do not make the engine log prompts."""
    size = sum(len(arg.encode()) for arg in args)
    if size > MAX_ENGINE_ARGS_BYTES:
        raise ValueError(
            f"{size} bytes in all, above the limit of {MAX_ENGINE_ARGS_BYTES} bytes; pass "
            "long values in a file the engine reads (e.g. --chat-template /path/to/file)"
        )
    for arg in args:  # vLLM reads --a_b as --a-b, and a long option by any unique prefix
        name = arg.split("=", 1)[0].replace("_", "-")
        given = arg.split("=", 1)[0]
        if len(name) > len("--enable-log-") and any(f.startswith(name) for f in PROMPT_LOGGING):
            raise ValueError(
                f"{given} makes the engine log prompts or completions, which "
                "gpufleet never stores or logs: remove it (request metrics are in /metrics)"
            )
        if name == "--config":
            raise ValueError(
                f"{given} reads the engine's options from a file gpufleet cannot check (it "
                "may turn on prompt logging): write the options in engine_args instead"
            )
        for flag, shortest, env in SECRET_FLAGS:
            if len(name) >= len(shortest) and flag.startswith(name):
                raise ValueError(
                    f"{given} takes a secret, and engine_args are stored, shown by GET and "
                    f"sent to the planes: remove it and set {env} in the plane's environment"
                )
    return args


SECRET_FLAGS = (("--hf-token", "--hf-t", "HF_TOKEN"), ("--api-key", "--api-k", "VLLM_API_KEY"))
"""vLLM flags whose value is a secret: (flag, its shortest unique prefix, the variable the
engine reads instead)."""


class ShadowSpec(Spec):
    """A shadow revision beside the deployment (docs/rollouts.md#shadow-traffic): on every
    cluster the deployment is placed on, ``replicas`` replicas of the deployment's revision
    with the fields set here changed, given a copy of ``share`` of its requests, fire and
    forget (answers discarded). Not a revision of the deployment: changing it is not one."""

    share: float = Field(
        gt=0, le=1, description="the share of the deployment's requests copied to the shadow"
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_SHADOW_REPLICAS,
        description="the shadow's replicas on each cluster the deployment is placed on",
    )
    model_id: Annotated[str | None, StringConstraints(min_length=1, max_length=MAX_TEXT)] = None
    model_revision: Annotated[str | None, _text(128)] = None
    engine_image: Annotated[str | None, _text()] = None
    engine_args: list[EngineArg] | None = Field(
        default=None,
        max_length=MAX_ENGINE_ARGS,
        description="unset: the deployment's; set: these instead (not appended)",
    )

    @field_validator("engine_args")
    @classmethod
    def _fits_a_snapshot(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else checked_engine_args(v)


class DeploymentSpec(Spec):
    name: Name
    model_id: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)]
    model_revision: Annotated[str, _text(128)] = "main"
    engine_image: Annotated[str, _text()] = "vllm/vllm-openai:v0.32.0"
    engine_args: list[EngineArg] = Field(
        default_factory=list,
        max_length=MAX_ENGINE_ARGS,
        description=f"At most {MAX_ENGINE_ARGS} arguments of {MAX_ENGINE_ARG} characters, "
        f"{MAX_ENGINE_ARGS_BYTES // 1024} KiB in all.",
    )
    gpus_per_replica: int = Field(ge=1, le=64)
    gpu_types: list[GpuTypeName] = Field(
        min_length=1, max_length=MAX_GPU_TYPES, description="Acceptable GPU types."
    )
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    priority: int = Field(default=100, ge=0, le=1000, description="Higher is placed first.")
    traffic: dict[Annotated[str, _text(63)], Annotated[float, Field(ge=0, le=MAX_WEIGHT)]] = Field(
        default_factory=dict,
        max_length=MAX_NAMES,
        description="Where requests come from: region name → weight.",
    )
    failover: FailoverSpec = Field(default_factory=FailoverSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    shadow: ShadowSpec | None = Field(
        default=None, description="a shadow revision mirrored a share of the requests"
    )

    @field_validator("name")
    @classmethod
    def _not_a_lane(cls, v: str) -> str:
        if re.fullmatch(LANE_NAME, v):
            raise ValueError(
                f"'{v}' ends like a rollout lane's name (NAME--rREVISION); pick another name"
            )
        if v.endswith(SHADOW_SUFFIX):
            raise ValueError(
                f"'{v}' ends like a shadow lane's name (NAME{SHADOW_SUFFIX}); pick another name"
            )
        return v

    @field_validator("engine_args")
    @classmethod
    def _fits_a_snapshot(cls, v: list[str]) -> list[str]:
        return checked_engine_args(v)

    @field_validator("gpu_types")
    @classmethod
    def _sorted_unique(cls, v: list[str]) -> list[str]:
        return sorted(set(v))


REVISION_FIELDS = (
    "model_id",
    "model_revision",
    "engine_image",
    "engine_args",
    "gpus_per_replica",
    "gpu_types",
)


class Role(StrEnum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"


class TokenSpec(Spec):
    name: Name
    role: Role
    description: str | None = Field(default=None, max_length=255)
    expires_at: When | None = None


class ApiPriceSpec(Spec):
    """A public API's price for a model (e.g. a hosted Llama or a closed model of the same
    class), per million tokens: what each deployment of `model_id` is set against in
    `GET /costs` ($/Mtok and the break-even volume)."""

    name: Name
    model_id: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)] = Field(
        description="the deployments' `model_id` this price is compared with"
    )
    input_price_per_mtok: Decimal = Field(ge=0, max_digits=14, decimal_places=6)
    output_price_per_mtok: Decimal = Field(ge=0, max_digits=14, decimal_places=6)
    source: Annotated[str, _text()] | None = Field(
        default=None, description="where the price comes from (provider, model, date)"
    )

    @field_validator("input_price_per_mtok", "output_price_per_mtok")
    @classmethod
    def _exact(cls, v: Decimal) -> Decimal:
        return stored_decimal(v)  # NUMERIC(14, 6), as a pool's price
