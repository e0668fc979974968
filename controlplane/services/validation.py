"""Turn pydantic validation errors into InvalidSpec naming each field and what to change."""

from __future__ import annotations

from pydantic import ValidationError

from controlplane.errors import FieldError, InvalidSpec


def field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "body"


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
    errors = [
        FieldError(field_path(tuple(e["loc"])), friendly(e["type"], e["msg"])) for e in exc.errors()
    ]
    detail = "; ".join(f"{e.field}: {e.message}" for e in errors)
    return InvalidSpec(f"invalid {kind}: {detail}", errors)
