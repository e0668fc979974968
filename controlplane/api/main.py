"""Process entry for the API server: `uvicorn --factory controlplane.api.main:build_app`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.replans import ReplanRequests
from controlplane.settings import get_settings
from gpufleet_logging import configure_logging

log = logging.getLogger("gpufleet.api")


def _send_replan(reason: str) -> None:
    from controlplane.tasks import request_replan

    request_replan(reason, retry=False)


def dispatch_procurement(actions: list[Any]) -> None:
    """Send procurement tasks; requested rows stay, so the reconcile sweep resumes them."""
    from controlplane.tasks import dispatch_procurement as dispatch

    try:
        dispatch(actions)
    except Exception as exc:  # see the docstring
        log.warning("could not dispatch procurement (%s); the sweep will", type(exc).__name__)


def build_app() -> FastAPI:
    configure_logging("api", default_level="WARNING")
    return create_app(
        get_settings(),
        on_inventory_change=ReplanRequests(_send_replan).changed,
        dispatch_procurement=dispatch_procurement,
    )
