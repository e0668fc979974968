"""JSON request bodies read strictly: an object with the same key twice is refused (400
naming the key) instead of keeping the last value silently, as ``json.loads`` does. The CLI's
YAML loader refuses duplicate keys the same way."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute


class BodyRefused(HTTPException):
    """A body refused while FastAPI reads it (its 400 keeps this detail)."""


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise BodyRefused(
                    400,
                    f"the JSON body has the key {key[:64]!r} twice in one object; send each "
                    "key once",
                )
            seen.add(key)
    return obj


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=_distinct_keys)
        return self._json


class JsonRoute(APIRoute):
    """A route whose handler reads its body with ``StrictJsonRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive, request._send))

        return strict
