"""Process entry for the API server: `uvicorn --factory controlplane.api.main:build_app`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.settings import get_settings
from gpufleet_logging import configure_logging, current_request_id, request_id_bound

log = logging.getLogger("gpufleet.api")


class ReplanRequests:
    """Asks the workers for a re-plan off the request path, coalescing bursts.

    A write must not wait for the broker (nor fail when it is down): `request()` only sets a
    flag; one thread sends at most one `gpufleet.replan` per `min_gap_s`. The beat timer
    re-plans anyway if a request is lost. The re-plan carries the request id of the first
    write it serves (the worker logs it with that id).
    """

    def __init__(self, min_gap_s: float = 0.5, send: Callable[[str], None] | None = None) -> None:
        """`send(reason)` sends the task (default: `controlplane.tasks.request_replan`
        without publish retries, imported in the thread: the API starts without Celery)."""
        self._send = send
        self._wanted = threading.Event()
        self._reasons: set[str] = set()
        self._first_request: str | None = None
        self._lock = threading.Lock()
        self._min_gap_s = min_gap_s
        threading.Thread(target=self._run, name="replan-requests", daemon=True).start()

    def request(self, kind: str) -> None:
        with self._lock:
            self._reasons.add(f"{kind} changed")
            self._first_request = self._first_request or current_request_id()
        self._wanted.set()

    def _run(self) -> None:
        send = self._send or _send_replan
        while True:
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                reason, self._reasons = ", ".join(sorted(self._reasons)), set()
                rid, self._first_request = self._first_request, None
            try:
                with request_id_bound(rid):
                    send(reason)
            except Exception as exc:  # the timer covers it
                log.warning("could not request a re-plan (%s); the timer will", type(exc).__name__)
            time.sleep(self._min_gap_s)


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
        on_inventory_change=ReplanRequests().request,
        dispatch_procurement=dispatch_procurement,
    )
