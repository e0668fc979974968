"""Process entry for the API server: `uvicorn --factory controlplane.api.main:build_app`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.settings import get_settings

log = logging.getLogger("gpufleet.api")


class ReplanRequests:
    """Asks the workers for a re-plan off the request path, coalescing bursts.

    A write must not wait for the broker (nor fail when it is down): `request()` only sets a
    flag; one thread sends at most one `gpufleet.replan` per `min_gap_s`. The beat timer
    re-plans anyway if a request is lost.
    """

    def __init__(self, min_gap_s: float = 0.5) -> None:
        self._wanted = threading.Event()
        self._reasons: set[str] = set()
        self._lock = threading.Lock()
        self._min_gap_s = min_gap_s
        threading.Thread(target=self._run, name="replan-requests", daemon=True).start()

    def request(self, kind: str) -> None:
        with self._lock:
            self._reasons.add(f"{kind} changed")
        self._wanted.set()

    def _run(self) -> None:
        from controlplane.tasks import request_replan

        while True:
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                reason, self._reasons = ", ".join(sorted(self._reasons)), set()
            try:
                request_replan(reason, retry=False)
            except Exception as exc:  # the timer covers it
                log.warning("could not request a re-plan (%s); the timer will", type(exc).__name__)
            time.sleep(self._min_gap_s)


def dispatch_procurement(actions: list[Any]) -> None:
    """Send procurement tasks; requested rows stay, so the reconcile sweep resumes them."""
    from controlplane.tasks import dispatch_procurement as dispatch

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
        on_inventory_change=ReplanRequests().request,
        dispatch_procurement=dispatch_procurement,
    )
