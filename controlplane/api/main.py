"""Process entry for the API server: `uvicorn --factory controlplane.api.main:build_app`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.settings import get_settings

log = logging.getLogger("gpufleet.api")


def request_replan(kind: str) -> None:
    """Ask the workers for a re-plan; the timer re-plans anyway if the broker is down."""
    from controlplane.tasks import celery_app

    try:
        celery_app.send_task("gpufleet.replan", kwargs={"reason": f"{kind} changed"}, retry=False)
    except Exception as exc:  # the periodic re-plan covers a lost request
        log.warning("could not request a re-plan (%s); the timer will do it", type(exc).__name__)


def dispatch_procurement(actions: list[Any]) -> None:
    """Send procurement tasks; requested rows stay, so the reconcile sweep resumes them."""
    from controlplane.procurement_tasks import dispatch

    try:
        dispatch(actions)
    except Exception as exc:  # see the docstring
        log.warning("could not dispatch procurement (%s); the sweep will", type(exc).__name__)


def build_app() -> FastAPI:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    return create_app(
        get_settings(),
        on_inventory_change=request_replan,
        dispatch_procurement=dispatch_procurement,
    )
