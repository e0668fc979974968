"""The request id of the work in progress, carried by a context variable.

An HTTP front binds it for the time of one request (from ``X-Request-Id``, or a new one),
a Celery task for the time of one run (from its message headers); every log line written
meanwhile, in that task or any task it starts, carries it. Ids come from clients, so they
are cleaned before use: printable ASCII only, at most ``MAX_REQUEST_ID`` characters.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from contextvars import ContextVar, Token

MAX_REQUEST_ID = 64
"""The audit trail stores it (``audit_entries.request_id``); a UUID is 36, ours are 32."""
HEADER = "x-request-id"
"""The HTTP header (lower case, as ASGI gives it) and the Celery message header."""

_current: ContextVar[str | None] = ContextVar("gpufleet_request_id", default=None)


def new_request_id() -> str:
    """32 hex characters: unique, not secret."""
    return secrets.token_hex(16)


def clean_request_id(raw: str | bytes | None) -> str | None:
    """``raw`` as a request id fit for logs and headers: printable ASCII (space to ``~``),
    anything else dropped, cut to ``MAX_REQUEST_ID``; None when nothing is left."""
    if raw is None:
        return None
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    if (
        len(text) <= MAX_REQUEST_ID
        and text.isascii()
        and text.isprintable()
        and text.strip() == text
    ):
        return text or None  # the usual case, on every request of the data path: no copy
    kept = "".join(c for c in text[: MAX_REQUEST_ID * 4] if " " <= c <= "~").strip()
    return kept[:MAX_REQUEST_ID] or None


def current_request_id() -> str | None:
    return _current.get()


def bind_request_id(request_id: str | None) -> Token[str | None]:
    """Bind ``request_id`` (already clean) until ``unbind_request_id(token)``: for hooks
    that start and end apart (Celery's task_prerun and task_postrun)."""
    return _current.set(request_id)


def unbind_request_id(token: Token[str | None]) -> None:
    _current.reset(token)


@contextlib.contextmanager
def request_id_bound(request_id: str | None) -> Iterator[None]:
    """Bind ``request_id`` (already clean) for the ``with`` block, then restore the one
    before."""
    token = _current.set(request_id)
    try:
        yield
    finally:
        _current.reset(token)
