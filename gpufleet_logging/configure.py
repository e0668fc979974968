"""``configure_logging(process)``: every process's composition root calls it once, first.

Settings (environment):

- ``GPUFLEET_LOG_FORMAT``: ``json`` (the default) or ``text``. JSON by default because every
  process of the fleet is a service whose stderr goes to a file or a log collector, not to
  a terminal, and the format must not change with where stderr goes (a pipe to ``grep``
  would otherwise get another one). Set ``text`` to read a process by eye.
- ``GPUFLEET_LOG_LEVEL``: a level name (``DEBUG`` … ``CRITICAL``); the process's own default
  otherwise.
- ``GPUFLEET_SENTRY_DSN``: optional, see ``sentry.py``.

A value that is not understood is logged as a warning naming what to set, and the default
used: a typo in a logging setting never stops a router.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TextIO

from gpufleet_logging.formats import JsonFormatter, RequestIdFilter, TextFormatter
from gpufleet_logging.sentry import configure_sentry

FORMATS = ("json", "text")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Servers that configure loggers of their own: their lines go through ours instead.
ADOPTED_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "py.warnings")
# HTTP and cloud clients that log every URL (INFO) and every header or signed request
# (DEBUG): a webhook URL, a bearer token, an AWS session token or a Google access token is a
# secret. Their warnings still show, also at GPUFLEET_LOG_LEVEL=DEBUG.
QUIET_LOGGERS = (
    "httpx",
    "httpcore",
    "urllib3",
    "botocore",
    "boto3",
    "s3transfer",
    "google.auth",
    "google.api_core",
    "google.cloud",
    "grpc",
    "nats",
)


@dataclass(frozen=True)
class LogSettings:
    format: str = "json"
    level: str = "INFO"
    sentry_dsn: str | None = None
    problems: list[str] = field(default_factory=list)
    """What was not understood, to log once logging works."""

    @classmethod
    def from_env(cls, env: Mapping[str, str], default_level: str = "INFO") -> LogSettings:
        problems: list[str] = []
        fmt = env.get("GPUFLEET_LOG_FORMAT", "").strip().lower() or "json"
        if fmt not in FORMATS:
            problems.append(
                f"GPUFLEET_LOG_FORMAT={fmt!r} is not one of {', '.join(FORMATS)}: using json"
            )
            fmt = "json"
        level = env.get("GPUFLEET_LOG_LEVEL", "").strip().upper() or default_level
        if level not in LEVELS:
            problems.append(
                f"GPUFLEET_LOG_LEVEL={level!r} is not one of {', '.join(LEVELS)}: "
                f"using {default_level}"
            )
            level = default_level
        dsn = env.get("GPUFLEET_SENTRY_DSN", "").strip() or None
        return cls(fmt, level, dsn, problems)


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler this module installed, so that a second call replaces it."""


def configure_logging(
    process: str,
    default_level: str = "INFO",
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> LogSettings:
    """Send every log line of this process to ``stream`` (stderr) in the configured format,
    each carrying ``process`` and the bound request id; start Sentry when configured.
    Calling it again replaces what an earlier call installed."""
    settings = LogSettings.from_env(os.environ if env is None else env, default_level)
    handler = _OurHandler(stream if stream is not None else sys.stderr)
    formatter = JsonFormatter(process) if settings.format == "json" else TextFormatter(process)
    handler.setFormatter(formatter)
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
    for name in ADOPTED_LOGGERS:
        adopted = logging.getLogger(name)
        adopted.handlers.clear()
        adopted.propagate = True
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    log = logging.getLogger("gpufleet.logging")
    for problem in settings.problems:
        log.warning(problem)
    configure_sentry(process, settings.sentry_dsn)
    return settings
