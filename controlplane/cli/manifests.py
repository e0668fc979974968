"""Manifests and plans, with no I/O: kinds and aliases, YAML documents, and what `apply` would do.

A manifest is the API body plus `kind:`. Specs are compared after validation with the same
pydantic model the server uses, so defaults, ordering and number formats never show as changes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import yaml
from pydantic import ValidationError

from controlplane.services.validation import field_errors
from controlplane.specs import (
    ApiPriceSpec,
    ClusterSpec,
    DeploymentSpec,
    GpuTypeSpec,
    PoolSpec,
    ProviderSpec,
    RegionSpec,
    Spec,
    TokenSpec,
)


class CliError(Exception):
    """An error shown as one line; `exit_code` 2 for bad input, 1 for a refused operation."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class Kind:
    """A kind as the CLI sees it; `spec` is None for read-only kinds (placements, events…)."""

    name: str  # "Pool"
    path: str  # "pools"
    aliases: tuple[str, ...] = ()
    spec: type[Spec] | None = None

    @property
    def writable(self) -> bool:
        return self.spec is not None


# Apply order: every kind after the kinds it references by name.
WRITABLE = (
    Kind("Provider", "providers", ("provider", "prov"), ProviderSpec),
    Kind("GpuType", "gpu-types", ("gpu-type", "gputype", "gputypes", "gpu", "gpus"), GpuTypeSpec),
    Kind("Region", "regions", ("region", "reg"), RegionSpec),
    Kind("Pool", "pools", ("pool",), PoolSpec),
    Kind("Cluster", "clusters", ("cluster",), ClusterSpec),
    Kind("Deployment", "deployments", ("deployment", "deploy", "deploys"), DeploymentSpec),
    Kind("Token", "tokens", ("token",), TokenSpec),
    Kind(
        "ApiPrice",
        "api-prices",
        ("api-price", "apiprice", "apiprices", "price", "prices"),
        ApiPriceSpec,
    ),
)
READ_ONLY = (
    Kind("Placement", "placements", ("placement",)),
    Kind("Replica", "replicas", ("replica",)),
    Kind("Instance", "instances", ("instance",)),
    Kind("Event", "events", ("event", "ev")),
    Kind("AuditEntry", "audit", ("audit-log", "auditentry", "auditentries")),
)
ALL_KINDS = WRITABLE + READ_ONLY
APPLY_ORDER = {k.name: i for i, k in enumerate(WRITABLE)}

_BY_ALIAS: dict[str, Kind] = {}
for _k in ALL_KINDS:
    for _alias in (_k.name.lower(), _k.path, *_k.aliases):
        _BY_ALIAS[_alias] = _k


def resolve_kind(word: str) -> Kind:
    """'pool', 'pools', 'Pool', 'deploy', 'gpu-type'… → the Kind; a clear error otherwise."""
    found = _BY_ALIAS.get(word.strip().lower().replace("_", "-"))
    if found is None:
        known = ", ".join(k.path for k in ALL_KINDS)
        raise CliError(f"unknown kind '{word}'; use one of: {known}", exit_code=2)
    return found


def writable_kind(name: str) -> Kind:
    kind = resolve_kind(name)
    if not kind.writable:
        raise CliError(f"{kind.path} are read-only: the control plane writes them", exit_code=2)
    return kind


# documents ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    source: str  # "fleet.yaml:12" (file and the line the document starts on)
    body: dict[str, Any]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML where a key given twice in one mapping is an error (PyYAML keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` may override what it merges: not a duplicate
            key = self.construct_object(key_node, deep=True)  # pyright: ignore[reportUnknownMemberType]
            line = key_node.start_mark.line + 1
            if not isinstance(key, Hashable):
                continue  # the base constructor reports an unhashable key
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key '{key}' (first at line {seen[key]}); keep one of them",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_documents(text: str, filename: str) -> list[Document]:
    """Every non-empty YAML document in `text`; a `kind: List` expands to its items."""
    try:
        loader = _UniqueKeyLoader(text)  # its reader refuses characters YAML does not take
    except yaml.YAMLError as exc:
        raise CliError(_yaml_error(exc, filename), exit_code=2) from exc
    docs: list[Document] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            line = node.start_mark.line + 1
            data = loader.construct_document(node)
            _expand(data, f"{filename}:{line}", docs)
    except yaml.YAMLError as exc:
        raise CliError(_yaml_error(exc, filename), exit_code=2) from exc
    except RecursionError:  # PyYAML composes and constructs nested nodes recursively
        message = f"{filename}: not valid YAML: nested too deeply; flatten the structure"
        raise CliError(message, exit_code=2) from None
    finally:
        loader.dispose()  # pyright: ignore[reportAttributeAccessIssue]
    return docs


def _yaml_error(exc: yaml.YAMLError, filename: str) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{filename}:{mark.line + 1}" if mark is not None else filename
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: not valid YAML: {problem}"


MAX_DOCUMENTS = 10_000
"""Objects one file may hold, `kind: List` items included: YAML aliases let a few hundred
bytes name millions of them."""


def _expand(data: Any, source: str, docs: list[Document]) -> None:
    """Append the objects ``data`` holds to ``docs`` (a `kind: List` is its items, in order)."""
    stack: list[tuple[Any, str]] = [(data, source)]
    visited = 0
    while stack:
        data, source = stack.pop()
        visited += 1
        if visited > MAX_DOCUMENTS or len(docs) == MAX_DOCUMENTS:  # Lists count too
            raise CliError(
                f"{source}: more than {MAX_DOCUMENTS} objects in one file (YAML aliases count "
                "each time they are used); split the file",
                exit_code=2,
            )
        if data is None:
            continue
        if not isinstance(data, dict):
            raise CliError(f"{source}: a manifest must be a mapping with `kind:`", exit_code=2)
        if data.get("kind") != "List":
            docs.append(Document(source, data))
            continue
        items = data.get("items")
        if not isinstance(items, list):
            raise CliError(f"{source}: a `kind: List` needs `items:` (a list)", exit_code=2)
        stack.extend((item, f"{source} items[{i}]") for i, item in reversed(list(enumerate(items))))


@dataclass(frozen=True)
class Manifest:
    kind: Kind
    name: str
    spec: Spec
    source: str

    @property
    def body(self) -> dict[str, Any]:
        """The request body: the validated spec as JSON, defaults filled, nulls dropped."""
        return self.spec.model_dump(mode="json", exclude_none=True)

    @property
    def ref(self) -> str:
        return f"{self.kind.path} '{self.name}'"


def to_manifest(doc: Document) -> Manifest:
    body = dict(doc.body)
    word = body.pop("kind", None)
    if not isinstance(word, str):
        raise CliError(f"{doc.source}: missing `kind:` (e.g. kind: Pool)", exit_code=2)
    try:
        kind = writable_kind(word)
    except CliError as exc:
        raise CliError(f"{doc.source}: {exc.message}", exit_code=2) from exc
    name = body.get("name")
    label = f"{kind.path} '{name}'" if isinstance(name, str) else kind.path
    assert kind.spec is not None
    try:
        spec = kind.spec.model_validate(body)
    except ValidationError as exc:
        _, problems = field_errors(exc.errors())
        raise CliError(f"{doc.source}: {label}: {problems}", exit_code=2) from exc
    return Manifest(kind, getattr(spec, "name"), spec, doc.source)  # noqa: B009


def load_manifests(text: str, filename: str) -> list[Manifest]:
    """Parse and validate every object, in apply order; duplicates are an error."""
    manifests = [to_manifest(d) for d in parse_documents(text, filename)]
    if not manifests:
        raise CliError(f"{filename}: no objects found", exit_code=2)
    seen: dict[tuple[str, str], str] = {}
    for m in manifests:
        key = (m.kind.name, m.name)
        if key in seen:
            raise CliError(f"{m.source}: {m.ref} is also defined at {seen[key]}", exit_code=2)
        seen[key] = m.source
    return sorted(manifests, key=lambda m: APPLY_ORDER[m.kind.name])


def spec_fields(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A server object's spec fields only (no id, generation, timestamps or status)."""
    if kind.spec is None:
        return dict(obj)
    return {k: v for k, v in obj.items() if k in kind.spec.model_fields}


def as_manifest(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A server object as a re-applyable manifest (`kind:` first, spec fields, no status)."""
    return {"kind": kind.name, **spec_fields(kind, obj)}


# plans -------------------------------------------------------------------------------------


class Action(StrEnum):
    create = "create"
    update = "update"
    unchanged = "unchanged"


@dataclass(frozen=True)
class FieldChange:
    path: str
    old: Any
    new: Any


@dataclass(frozen=True)
class Change:
    manifest: Manifest
    action: Action
    fields: list[FieldChange] = field(default_factory=list)
    generation: int | None = None


def plan_one(manifest: Manifest, current: Mapping[str, Any] | None) -> Change:
    """Compare the manifest with the server's object (None: it does not exist yet).

    Both sides go through the kind's spec model and are compared as Python values, so
    "3.9" equals "3.900000" and two spellings of the same instant are equal.
    """
    if current is None:
        return Change(manifest, Action.create)
    assert manifest.kind.spec is not None
    try:
        server = manifest.kind.spec.model_validate(spec_fields(manifest.kind, current))
    except ValidationError:  # stored before today's limits: any change must fit them
        return Change(
            manifest,
            Action.update,
            [FieldChange("*", "(stored before today's limits)", manifest.body)],
            current.get("generation"),
        )
    old = server.model_dump(exclude_none=True)
    new = manifest.spec.model_dump(exclude_none=True)
    old_json = server.model_dump(mode="json", exclude_none=True)
    new_json = manifest.body
    changes = [
        FieldChange(".".join(p), _at(old_json, p), _at(new_json, p))
        for p in changed_paths(old, new)
    ]
    action = Action.update if changes else Action.unchanged
    return Change(manifest, action, changes, current.get("generation"))


_UNSET = object()


def changed_paths(old: Any, new: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths where `old` and `new` differ; mappings recurse, anything else is a leaf."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        paths: list[tuple[str, ...]] = []
        for key in sorted(set(old) | set(new), key=str):
            paths += changed_paths(old.get(key, _UNSET), new.get(key, _UNSET), (*prefix, key))
        return paths
    return [] if old == new else [prefix]


def _at(doc: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = doc
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return _UNSET
        value = value[part]
    return value


def is_unset(value: Any) -> bool:
    return value is _UNSET


def has_changes(changes: Iterable[Change]) -> bool:
    return any(c.action != Action.unchanged for c in changes)
