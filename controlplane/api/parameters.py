"""Path and query parameters are checked once, for every route, before any handler runs.

PostgreSQL text cannot hold NUL, and no name, id or filter value needs a control character,
so a parameter carrying one is refused with a 422 naming it; it never reaches the database.
"""

from __future__ import annotations

import unicodedata

from fastapi import Request

from controlplane.errors import FieldError, InvalidSpec


def control_character_in(text: str) -> str | None:
    """The first control character (Unicode category Cc: NUL, newline, DEL…) in `text`."""
    if text.isprintable():  # no Cc in it (they are all unprintable): skip the per-char scan
        return None
    return next((c for c in text if unicodedata.category(c) == "Cc"), None)


def _refused(where: str, name: str, char: str) -> InvalidSpec:
    message = (
        f"contains the control character U+{ord(char):04X}; names, ids and filter values are "
        "printable text, remove it"
    )
    field = f"{where}.{name}"  # as FastAPI names a parameter it refuses (`query.limit`)
    return InvalidSpec(f"{where} parameter {name!r}: {message}", [FieldError(field, message)])


async def reject_control_characters(request: Request) -> None:
    """A dependency of the whole app: 422 on the first path or query parameter with a control
    character (async: it only reads the parsed URL, so no thread hop)."""
    for name, value in request.path_params.items():
        if isinstance(value, str) and (char := control_character_in(value)):
            raise _refused("path", name, char)
    for name, value in request.query_params.multi_items():
        if char := control_character_in(name) or control_character_in(value):
            raise _refused("query", name, char)
