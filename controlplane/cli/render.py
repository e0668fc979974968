"""How objects and plans look on a terminal: per-kind tables, YAML/JSON, plans, describe.

`-o json|yaml|name` are plain text for scripts; tables and plans go through rich.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controlplane.cli.manifests import (
    Action,
    Change,
    Kind,
    as_manifest,
    is_unset,
)


@dataclass(frozen=True)
class View:
    """What a getter may look at besides the object: the time now and id → name maps."""

    now: datetime
    names: Mapping[str, str]

    def name_of(self, object_id: Any) -> str:
        if not object_id:
            return "-"
        return self.names.get(str(object_id), str(object_id)[:8])


Getter = Callable[[Mapping[str, Any], View], Any]


@dataclass(frozen=True)
class Column:
    header: str
    get: Getter
    wide: bool = False


def age(when: Any, now: datetime) -> str:
    """'42s', '5m', '3h', '2d'; '-' when unknown."""
    if not when:
        return "-"
    then = datetime.fromisoformat(str(when))
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _f(key: str) -> Getter:
    return lambda o, v: o.get(key)


def _status(key: str) -> Getter:
    return lambda o, v: (o.get("status") or {}).get(key)


def _age(key: str) -> Getter:
    return lambda o, v: age(o.get(key), v.now)


def _ref(key: str) -> Getter:
    return lambda o, v: v.name_of(o.get(key))


def _joined(key: str) -> Getter:
    return lambda o, v: ",".join(str(x) for x in o.get(key) or []) or "-"


def _min_max(o: Mapping[str, Any], v: View) -> str:
    scaling = o.get("autoscaling") or {}
    return f"{scaling.get('min_replicas', '?')}–{scaling.get('max_replicas', '?')}"


def _failover(o: Mapping[str, Any], v: View) -> str:
    """``active_active``, or ``active_passive→<standby cluster> (n warm)``."""
    failover = o.get("failover") or {}
    if failover.get("mode") != "active_passive":
        return "active_active"
    warm = ((o.get("status") or {}).get("placement") or {}).get("standby_replicas", 0)
    return f"active_passive→{failover.get('standby_cluster')} ({warm} warm)"


def _heartbeat(o: Mapping[str, Any], v: View) -> str:
    return age((o.get("status") or {}).get("last_heartbeat_at"), v.now)


def _pool_terms(o: Mapping[str, Any], v: View) -> Any:
    return o.get("committed_gpus") or o.get("quota_gpus") or "-"


def _object(o: Mapping[str, Any], v: View) -> str:
    return f"{o.get('object_kind', '?')}/{o.get('object_name') or '-'}"


COLUMNS: dict[str, list[Column]] = {
    "providers": [
        Column("NAME", _f("name")), Column("CLOUD", _f("provider_kind")),
        Column("CLASS", _f("provider_class")), Column("CERTIFICATIONS", _joined("certifications")),
        Column("CREDENTIALS", _f("credentials_ref"), wide=True), Column("AGE", _age("created_at")),
    ],
    "regions": [
        Column("NAME", _f("name")), Column("PROVIDER", _f("provider")), Column("CODE", _f("code")),
        Column("JURISDICTION", _f("jurisdiction")), Column("LAT", _f("latitude"), wide=True),
        Column("LON", _f("longitude"), wide=True), Column("AGE", _age("created_at")),
    ],
    "gpu-types": [Column("NAME", _f("name")), Column("MEMORY GIB", _f("memory_gib"))],
    "pools": [
        Column("NAME", _f("name")), Column("PROVIDER", _f("provider")),
        Column("REGION", _f("region")), Column("GPU TYPE", _f("gpu_type")),
        Column("PURCHASE", _f("purchase_type")), Column("GPUS", _f("gpus")),
        Column("$/GPU-H", _f("price_per_gpu_hour")),
        Column("GPUS/INSTANCE", _f("gpus_per_instance"), wide=True),
        Column("INSTANCE TYPE", _f("instance_type"), wide=True),
        Column("COMMITTED/QUOTA", _pool_terms, wide=True),
        Column("TERM END", _f("term_end"), wide=True),
    ],
    "clusters": [
        Column("NAME", _f("name")), Column("REGION", _f("region")),
        Column("STATE", _status("state")), Column("HEARTBEAT", _heartbeat),
        Column("POOLS", lambda o, v: len(o.get("pools") or [])),
        Column("CORDONED", _f("cordoned"), wide=True), Column("ENDPOINT", _f("endpoint"), wide=True),
        Column("AGENT", _status("agent_version"), wide=True),
    ],
    "deployments": [
        Column("NAME", _f("name")), Column("MODEL", _f("model_id")),
        Column("GPUS/REPLICA", _f("gpus_per_replica")), Column("REPLICAS", _min_max),
        Column("PRIORITY", _f("priority")), Column("REVISION", _status("revision")),
        Column("GPU TYPES", _joined("gpu_types"), wide=True),
        Column("SPOT", lambda o, v: (o.get("placement") or {}).get("spot_allowed"), wide=True),
        Column("JURISDICTIONS",
               lambda o, v: ",".join((o.get("placement") or {}).get("allowed_jurisdictions") or [])
               or "any", wide=True),
        Column("FAILOVER", _failover, wide=True),
    ],
    "tokens": [
        Column("NAME", _f("name")), Column("ROLE", _f("role")), Column("PREFIX", _status("prefix")),
        Column("LAST USED", lambda o, v: age((o.get("status") or {}).get("last_used_at"), v.now)),
        Column("EXPIRES", _f("expires_at")), Column("DESCRIPTION", _f("description"), wide=True),
    ],
    "api-prices": [
        Column("NAME", _f("name")), Column("MODEL", _f("model_id")),
        Column("$/MTOK IN", _f("input_price_per_mtok")),
        Column("$/MTOK OUT", _f("output_price_per_mtok")), Column("SOURCE", _f("source")),
    ],
    "placements": [
        Column("DEPLOYMENT", _ref("deployment_id")), Column("CLUSTER", _ref("cluster_id")),
        Column("POOL", _ref("pool_id")), Column("REPLICAS", _f("replicas")),
        Column("MIN–MAX", lambda o, v: f"{o.get('min_replicas')}–{o.get('max_replicas')}"),
        Column("$/H", _f("cost_per_hour")), Column("PLAN", _f("plan_generation"), wide=True),
        Column("ID", _f("id"), wide=True),
    ],
    "replicas": [
        Column("NAME", _f("name")), Column("DEPLOYMENT", _ref("deployment_id")),
        Column("CLUSTER", _ref("cluster_id")), Column("STATE", _f("state")),
        Column("REVISION", _f("revision")), Column("AGE", _age("created_at")),
        Column("ENDPOINT", _f("endpoint"), wide=True), Column("ID", _f("id"), wide=True),
    ],
    "instances": [
        Column("ID", lambda o, v: str(o.get("id", ""))[:8]), Column("POOL", _ref("pool_id")),
        Column("CLUSTER", _ref("cluster_id")), Column("GPUS", _f("gpus")),
        Column("STATE", _f("state")), Column("HEALTH", _f("health")),
        Column("AGE", _age("created_at")),
        Column("PROVIDER ID", _f("provider_instance_id"), wide=True),
    ],
    "events": [
        Column("AGE", _age("time")), Column("TYPE", _f("type")), Column("OBJECT", _object),
        Column("MESSAGE", _f("message")),
    ],
    "audit": [
        Column("AGE", _age("time")), Column("ACTOR", _f("actor")), Column("ACTION", _f("action")),
        Column("KIND", _f("resource_kind")), Column("NAME", _f("resource_name")),
        Column("REQUEST", _f("request_id"), wide=True),
    ],
}  # fmt: skip

# Read-only kinds refer to other objects by id; a table shows their names instead.
REFERENCES: dict[str, tuple[str, ...]] = {
    "placements": ("deployments", "clusters", "pools"),
    "replicas": ("deployments", "clusters"),
    "instances": ("pools", "clusters"),
}


PIPED_WIDTH = 100_000
"""Not a terminal: no width limit, so a row stays one line for grep and awk (COLUMNS too)."""


def console() -> Console:
    out = Console(highlight=False, soft_wrap=False)
    if out.is_terminal:
        return out
    return Console(highlight=False, soft_wrap=False, width=PIPED_WIDTH)


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(kind: Kind, objects: Iterable[Mapping[str, Any]], view: View, wide: bool) -> Table:
    columns = [c for c in COLUMNS[kind.path] if wide or not c.wide]
    out = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for c in columns:
        out.add_column(c.header, overflow="fold")
    for obj in objects:
        out.add_row(*(Text(cell(c.get(obj, view))) for c in columns))
    return out


def as_yaml(documents: list[Any]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, allow_unicode=True, width=100)


def formatted(kind: Kind, objects: list[dict[str, Any]], output: str, single: bool) -> str:
    """`-o json|yaml|name` as text. YAML of a writable kind is a re-applyable manifest."""
    if output == "name":
        key = "name" if kind.writable else "id"
        return "".join(f"{kind.name.lower()}/{o.get(key)}\n" for o in objects)
    if output == "json":
        data: Any = objects[0] if single else {"items": objects}
        return json.dumps(data, indent=2, default=str) + "\n"
    docs = [as_manifest(kind, o) if kind.writable else o for o in objects]
    return as_yaml(docs) if docs else ""


# plans -------------------------------------------------------------------------------------

_MARK = {
    Action.create: ("+", "green"),
    Action.update: ("~", "yellow"),
    Action.unchanged: ("=", "dim"),
}


def short(value: Any) -> str:
    if is_unset(value):
        return "(unset)"
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "…"


def plan_lines(changes: Iterable[Change]) -> list[Text]:
    """One line per object ('+ create pools/a', '~ update …', '= unchanged …'), then field diffs."""
    lines: list[Text] = []
    for change in changes:
        mark, style = _MARK[change.action]
        m = change.manifest
        lines.append(
            Text.assemble((f"{mark} {change.action.value:<9} ", style), f"{m.kind.path}/{m.name}")
        )
        for f in change.fields:
            lines.append(
                Text.assemble(
                    f"      {f.path}: ", (short(f.old), "red"), " → ", (short(f.new), "green")
                )
            )
    return lines


def summary(changes: list[Change]) -> str:
    counts = {a: sum(1 for c in changes if c.action == a) for a in Action}
    return (
        f"{counts[Action.create]} to create, {counts[Action.update]} to update, "
        f"{counts[Action.unchanged]} unchanged"
    )


# describe ----------------------------------------------------------------------------------


def describe(
    kind: Kind,
    obj: Mapping[str, Any],
    events: list[dict[str, Any]],
    now: datetime,
    rollout: Mapping[str, Any] | None = None,
    shadow: Mapping[str, Any] | None = None,
) -> str:
    """Plain text: a header, the spec as YAML, the status, the rollout (deployments that had
    one), the shadow report (deployments with a shadow), and recent events."""
    lines = [
        f"{kind.name}: {obj.get('name')}",
        f"Id:          {obj.get('id')}",
        f"Generation:  {obj.get('generation')}",
        f"Created:     {obj.get('created_at')} ({age(obj.get('created_at'), now)} ago)",
        f"Updated:     {obj.get('updated_at')} ({age(obj.get('updated_at'), now)} ago)",
        "Spec:",
        _indented(as_yaml([_spec_of(kind, obj)])),
        "Status:",
        _indented(as_yaml([obj.get("status") or {}])) if obj.get("status") else "  (none)",
    ]
    if rollout is not None:
        lines += ["Rollout:", _indented(rollout_lines(rollout))]
    if shadow is not None:
        lines += ["Shadow:", _indented(shadow_lines(shadow))]
    lines.append("Events:")
    if not events:
        lines.append("  (none)")
    for e in events:
        lines.append(
            f"  {age(e.get('time'), now):>5}  {e.get('type', ''):<24} {e.get('message', '')}"
        )
    return "\n".join(lines) + "\n"


def _spec_of(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in as_manifest(kind, obj).items() if k != "kind"}


def _indented(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip("\n").removesuffix("...").splitlines())


SHADOW_ROWS = (
    ("Requests", "requests", "{}"),
    ("Errors", "errors", "{}"),
    ("Error rate", "error_rate", "{:.1%}"),
    ("p50 TTFT", "p50_ttft_s", "{:.3f}s"),
    ("p99 TTFT", "p99_ttft_s", "{:.3f}s"),
    ("p50 end-to-end", "p50_e2e_s", "{:.3f}s"),
    ("p99 end-to-end", "p99_e2e_s", "{:.3f}s"),
)


def shadow_lines(r: Mapping[str, Any]) -> str:
    """The shadow report as a table: a row per figure, live and shadow side by side."""
    spec = r.get("spec") or {}
    changes = ", ".join(
        f"{k}={v}" for k, v in spec.items() if k not in ("share", "replicas")
    )  # the revision fields it changes
    lines = [
        f"Deployment:  {r.get('deployment')} (shadow lane {r.get('lane')})",
        f"Shadow:      {float(spec.get('share') or 0):.0%} of the requests copied, "
        f"{spec.get('replicas')} replica(s) per cluster; changes: {changes or 'none'}",
        f"Clusters:    {', '.join(r.get('clusters') or []) or '- (no report yet)'}",
        "Window:      since the shadow was last set or changed",
        "",
        f"{'':<16}{'live':>12}{'shadow':>12}",
    ]
    live, shadow = r.get("live") or {}, r.get("shadow") or {}
    for label, key, fmt in SHADOW_ROWS:
        lines.append(
            f"{label:<16}{fmt.format(live.get(key, 0)):>12}{fmt.format(shadow.get(key, 0)):>12}"
        )
    lines.append(f"{'Dropped':<16}{'-':>12}{shadow.get('dropped', 0):>12}")
    return "\n".join(lines) + "\n"


def rollout_lines(r: Mapping[str, Any]) -> str:
    """A rollout as `gpufleet rollout status` and `describe deployment` show it."""
    steps = ", ".join(f"{s:.0%}" for s in r.get("steps") or [])
    if r.get("strategy") == "blue_green":
        until = f", until {r['keep_until']}" if r.get("keep_until") else ""
        progress = (
            f"Keep:        the stable revision {float(r.get('keep_seconds') or 0):g}s at full "
            f"size after the switch{until}"
        )
    else:
        progress = (
            f"Step:        {int(r.get('step') or 0) + 1} of {len(r.get('steps') or [])} ({steps})"
        )
    lines = [
        f"Deployment:  {r.get('deployment')}",
        f"Strategy:    {r.get('strategy')}",
        f"Revisions:   {r.get('from_revision')} (stable) → {r.get('to_revision')} "
        f"(lane {r.get('lane')})",
        f"Phase:       {r.get('phase')}"
        + (f" (paused while {r['paused_from']})" if r.get("paused_from") else ""),
        progress,
        f"Share:       {float(r.get('share') or 0):.0%} of the traffic on the new revision",
        f"Since:       {r.get('since')}",
        f"Reason:      {r.get('reason') or '-'}",
    ]
    if r.get("finished_at"):
        lines.append(f"Finished:    {r['finished_at']}")
    windows = r.get("windows") or {}
    for side, label in (("before_switch", "before:"), ("stable", "stable:"), ("new", "new:")):
        w = windows.get(side)
        if w:
            lines.append(
                f"Window {label:<7} {w['requests']} requests, {w['error_rate']:.1%} errors, "
                f"p99 TTFT {w['p99_ttft_s']:.3f}s, p99 end-to-end {w['p99_e2e_s']:.3f}s"
            )
    return "\n".join(lines) + "\n"
