"""The two line formats: JSON (one object per line) and text (for eyes), both bounded.

A line never grows without bound, whatever a caller logs: the message is cut at
``MAX_MESSAGE`` characters, each extra field at ``MAX_FIELD``, a traceback keeps its first
and last ``MAX_TRACEBACK // 2`` characters (the innermost frame and the error are at the
end), and at most ``MAX_EXTRA_FIELDS`` extra fields are kept.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from gpufleet_logging.context import current_request_id

MAX_MESSAGE = 8192
MAX_FIELD = 1024
MAX_TRACEBACK = 16384
MAX_EXTRA_FIELDS = 32

# What every LogRecord has; anything else on a record came from ``extra={...}``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "request_id",
    "taskName",
}
_CORE = frozenset({"ts", "level", "logger", "process", "pid", "message", "request_id", "exc"})


def cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters plus a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters cut]"


def cut_middle(text: str, limit: int) -> str:
    """Keep both ends of a long text (a traceback's error is at its end)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n…[{len(text) - 2 * half} characters cut]…\n{text[-half:]}"


class RequestIdFilter(logging.Filter):
    """Puts the bound request id on every record that has none of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id()
        return True


def _timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


def _field(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    return cut(value if isinstance(value, str) else repr(value), MAX_FIELD)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """What the caller passed in ``extra``, bounded (never overriding a core key)."""
    out: dict[str, Any] = {}
    for key, value in vars(record).items():
        if key in _STANDARD or key in _CORE or key.startswith("_"):
            continue
        if len(out) == MAX_EXTRA_FIELDS:
            break
        out[cut(key, 64)] = _field(value)
    return out


def _traceback(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    if record.exc_info:
        text = formatter.formatException(record.exc_info)
    elif record.exc_text:
        text = record.exc_text
    else:
        text = ""
    if record.stack_info:
        text = f"{text}\n{formatter.formatStack(record.stack_info)}".strip()
    return cut_middle(text, MAX_TRACEBACK) if text else None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, process (the fleet's
    name for it: api, router, …), pid, message, request_id when known, the caller's extra
    fields, exc (the traceback as one string) when there is one."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "process": self.process,
            "pid": record.process,
            "message": cut(record.getMessage(), MAX_MESSAGE),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            line["request_id"] = rid
        line.update(extra_fields(record))
        if (tb := _traceback(self, record)) is not None:
            line["exc"] = tb
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``2026-01-02T03:04:05.678+00:00 WARNING router workloadplane.router.app
    [rid] message`` and the traceback below it."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", None)
        parts = [_timestamp(record.created), record.levelname, self.process, record.name]
        if rid:
            parts.append(f"[{rid}]")
        parts.append(cut(record.getMessage(), MAX_MESSAGE))
        extra = extra_fields(record)
        if extra:
            parts.append(" ".join(f"{k}={v}" for k, v in extra.items()))
        line = " ".join(str(p) for p in parts)
        tb = _traceback(self, record)
        return f"{line}\n{tb}" if tb else line
