"""Turn pydantic validation errors into InvalidSpec naming each field and what to change."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from controlplane.errors import FieldError, InvalidSpec

MAX_REPORTED_ERRORS = 20
"""Errors an answer names (then "and N more"): a body of a thousand unknown keys must not
get an answer many times its own size."""
MAX_PATH_CHARS = 200
"""A field path is cut here (a key may be as long as the body)."""


def field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
        if len(path) > MAX_PATH_CHARS:
            return path[:MAX_PATH_CHARS] + "…"
    return path or "body"


def field_errors(
    errors: Iterable[Mapping[str, Any]], drop_first: tuple[str, ...] = ()
) -> tuple[list[FieldError], str]:
    """The first MAX_REPORTED_ERRORS of pydantic's errors as FieldErrors (their locations
    without a leading ``drop_first``, like FastAPI's "body"), and the detail naming them,
    "and N more" when there were more."""
    fields: list[FieldError] = []
    more = 0
    for e in errors:
        if len(fields) == MAX_REPORTED_ERRORS:
            more += 1
            continue
        loc = tuple(e["loc"])
        if drop_first and loc[: len(drop_first)] == drop_first:
            loc = loc[len(drop_first) :]
        fields.append(FieldError(field_path(loc), friendly(e["type"], e["msg"])))
    detail = "; ".join(f"{f.field}: {f.message}" for f in fields)
    if more:
        detail += f"; and {more} more (fix these first)"
    return fields, detail


def friendly(error_type: str, message: str) -> str:
    message = message.removeprefix("Value error, ")
    if error_type == "extra_forbidden":
        return "unknown field; remove it (check the spelling against the schema)"
    if error_type == "missing":
        return "is required; add it"
    if error_type in ("union_tag_invalid", "union_tag_not_found"):  # a tagged union's `kind`
        tags = message.rpartition("expected tags: ")[2]
        return f"needs a 'kind' of {tags}" if tags != message else "needs an object with a 'kind'"
    return message


def invalid_spec_from(exc: ValidationError, kind: str) -> InvalidSpec:
    errors, detail = field_errors(exc.errors())
    return InvalidSpec(f"invalid {kind}: {detail}", errors)
