"""The mapping between Terraform values and API specs: pure functions, no I/O.

Exact plans rest on two rules (docs/terraform.md, "Plans"):
- a value the API normalises (decimals to 6 places, sorted sets, `Z` vs `+00:00`, 2 vs 2.0)
  reads back as what the configuration wrote when both mean the same;
- a knob left out of the configuration reads as unset while the API holds its default, and
  as the API's value once it differs (an out-of-band change shows as drift to undo).

Standard library only (tests load it without `tf`); tfschema.py turns Fields into tf schemas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SCALARS = ("string", "int", "number", "bool", "decimal", "datetime")


@dataclass(frozen=True)
class Field:
    """One spec field, spelled as in the API. `default` is the API's default (None: none);
    `block`: a nested block (one element when `many` is false)."""

    name: str
    type: str  # a SCALARS entry, "set", "list", "map_string", "map_number", "block"
    required: bool = False
    default: Any = None
    replace: bool = False
    description: str = ""
    element: str = "string"  # element type of set/list
    children: tuple[Field, ...] = ()
    many: bool = False
    api_name: str | None = None  # when Terraform reserves the API's name (`provider`)

    @property
    def key(self) -> str:
        """The field's name in API bodies."""
        return self.api_name or self.name


# --- comparing ------------------------------------------------------------------------------


def canonical(f: Field, value: Any) -> Any:
    """A form in which two values the API treats as the same are equal."""
    if value is None:
        return None
    if f.type == "block":
        elements = [_canonical_element(f, el) for el in (value if f.many else [value])]
        return sorted(elements, key=json.dumps) if f.many else elements[0]
    if f.type == "set":
        return sorted({json.dumps(_scalar(f.element, v)) for v in value})
    if f.type == "list":
        return [_scalar(f.element, v) for v in value]
    if f.type == "map_number":
        return {k: float(v) for k, v in value.items()}
    if f.type == "map_string":  # the API strips every string it is given
        return {k: v.strip() if isinstance(v, str) else v for k, v in dict(value).items()}
    return _scalar(f.type, value)


def _canonical_element(f: Field, element: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for c in f.children:
        v = element.get(c.name)
        if c.type == "block" and not c.many and isinstance(v, list):
            v = v[0] if v else None
        # only unset takes the default: `[]` is a value (a shadow's engine_args `[]` means
        # none, unset means the deployment's; schedule days `[]` means none, unset weekdays)
        out[c.name] = canonical(c, v if v is not None else c.default)
    return out


def _scalar(kind: str, value: Any) -> Any:
    if kind in ("int", "number"):
        return float(value)
    if kind == "decimal":
        try:
            return str(Decimal(str(value)).normalize())
        except InvalidOperation:
            return str(value)
    if kind == "url":
        return _url(str(value))
    if kind == "string" and isinstance(value, str):
        return value.strip()  # the API strips every string: "x " comes back "x"
    if kind == "datetime":
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return str(value)
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return value


def _url(value: str) -> str:
    """A URL as the API writes it back (pydantic's normal form): lower-case scheme and host, no
    default port, `/` for an empty path. Compared as written, `http://h:8000` came back
    `http://h:8000/` and every apply ended in "inconsistent result" (a cluster tainted:
    replaced, its agent's NATS credentials with it)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return value
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(scheme)
    netloc = host if port is None or port == default else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, parts.fragment))


def same(f: Field, a: Any, b: Any) -> bool:
    return canonical(f, a) == canonical(f, b)


# --- API → Terraform ------------------------------------------------------------------------


def read_fields(
    fields: tuple[Field, ...], api: dict[str, Any], prior: dict[str, Any] | None
) -> dict:
    """The Terraform values of `fields` for an API object, given what the state held."""
    prior = prior or {}
    return {f.name: read_value(f, api.get(f.key), prior.get(f.name)) for f in fields}


def read_value(f: Field, api: Any, prior: Any) -> Any:
    if f.type == "block":
        return _read_block(f, api, prior)
    if api is None:
        return None
    if prior is not None and same(f, api, prior):
        return prior
    if prior is None and not f.required and same(f, api, f.default):
        return None
    return _to_tf(f, api)


def _read_block(f: Field, api: Any, prior: Any) -> list[dict[str, Any]]:
    prior_list = [p for p in (prior or []) if p is not None]
    if f.many:
        api_list = api or []
        if same(f, api_list, prior_list):
            return prior_list
        return [read_fields(f.children, el, None) for el in api_list]
    prior_el = prior_list[0] if prior_list else None
    element = read_fields(f.children, api or {}, prior_el)
    if prior_el is None and all(v is None or v == [] for v in element.values()):
        return []
    return [element]


def _to_tf(f: Field, value: Any) -> Any:
    if f.type in ("set", "list"):
        return list(value)
    if f.type in ("map_string", "map_number"):
        return dict(value)
    if f.type in ("decimal", "datetime", "string"):
        return str(value)
    return value


# --- Terraform → API ------------------------------------------------------------------------


def to_spec(fields: tuple[Field, ...], values: dict[str, Any]) -> dict[str, Any]:
    """The API body for Terraform values: what is unset is left out (the API's default)."""
    body: dict[str, Any] = {}
    for f in fields:
        v = values.get(f.name)
        if v is None or (f.type == "block" and not v):
            continue
        if f.type == "block":
            elements = [to_spec(f.children, el) for el in v]
            body[f.key] = elements if f.many else elements[0]
        elif f.type == "int" and isinstance(v, float) and v.is_integer():
            body[f.key] = int(v)
        else:
            body[f.key] = v
    return body


def changed(fields: tuple[Field, ...], prior: dict[str, Any], planned: dict[str, Any]) -> bool:
    return any(not same(f, _unwrapped(f, prior), _unwrapped(f, planned)) for f in fields)


def _unwrapped(f: Field, values: dict[str, Any]) -> Any:
    v = values.get(f.name)
    if f.type == "block" and not f.many:
        return v[0] if v else None
    return v
