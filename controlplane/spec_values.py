"""Checks every spec applies to every field, whatever its type (see `specs.Spec`).

- A bool is not a number: JSON `true` for `memory_gib` is refused, not stored as 1.
- Text holds no control characters but tab and newline: PostgreSQL cannot store NUL, and
  nothing a user names or describes needs the others.
"""

from __future__ import annotations

import re
import types
import unicodedata
from decimal import Decimal
from typing import Annotated, Any, Union, get_args, get_origin

ALLOWED_CONTROLS = frozenset("\t\n\r")
NUMBERS = (int, float, Decimal)


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_canonical_uuid(value: str) -> bool:
    """``value`` is an id as the API writes one (8-4-4-4-12 lowercase hex digits)."""
    return _CANONICAL_UUID.fullmatch(value) is not None


def _bare(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def is_number(annotation: Any) -> bool:
    """`int`, `float`, `Decimal`, constrained or optional; not `bool`, not a union with it."""
    annotation = _bare(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        return bool(members) and all(is_number(a) for a in members)
    return annotation in NUMBERS


def bool_for_number(annotation: Any, value: Any) -> bool:
    """True when `value` is a bool (or holds one) where `annotation` wants numbers."""
    if isinstance(value, bool):
        return is_number(annotation)
    if not isinstance(value, list | dict):  # nothing could hold a bool: skip the annotation
        return False
    origin, args = get_origin(_bare(annotation)), get_args(_bare(annotation))
    if origin is list and args and is_number(args[0]) and isinstance(value, list):
        return any(isinstance(v, bool) for v in value)
    if origin is dict and len(args) == 2 and is_number(args[1]) and isinstance(value, dict):
        return any(isinstance(v, bool) for v in value.values())
    return False


def control_character(value: Any) -> str | None:
    """The first disallowed control character in a string, or in a list's or dict's strings."""
    if isinstance(value, str):
        if value.isprintable():  # no Cc in it (they are all unprintable): skip the scan
            return None
        return next(
            (c for c in value if unicodedata.category(c) == "Cc" and c not in ALLOWED_CONTROLS),
            None,
        )
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list | tuple):
        return next((c for v in value if (c := control_character(v))), None)
    return None
