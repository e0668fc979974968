"""Logging for every gpufleet process, both planes: one format (JSON lines or text), the
request id carried by a context variable, optional Sentry. Imports neither plane, so the
control plane and the workload plane share it (import-linter keeps it so).

A process calls ``configure_logging("router")`` once in its composition root; an HTTP front
binds the request id per request with ``request_id_bound``. Never log a prompt, a completion
or a request body: the fronts log sizes, codes and ids only (docs/logging.md).
"""

from gpufleet_logging.configure import LogSettings, configure_logging
from gpufleet_logging.context import (
    HEADER,
    MAX_REQUEST_ID,
    bind_request_id,
    clean_request_id,
    current_request_id,
    new_request_id,
    request_id_bound,
    unbind_request_id,
)

__all__ = [
    "HEADER",
    "MAX_REQUEST_ID",
    "LogSettings",
    "bind_request_id",
    "clean_request_id",
    "configure_logging",
    "current_request_id",
    "new_request_id",
    "request_id_bound",
    "unbind_request_id",
]
