"""Re-plan requests off the caller's path, coalesced (the API's writes, the bus's reports)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpufleet_logging import current_request_id, request_id_bound

log = logging.getLogger("gpufleet.replans")


class ReplanRequests:
    """Asks the workers for a re-plan off the request path, coalescing bursts.

    A write (or a plane's report) must not wait for the broker (nor fail when it is down):
    `request()` only sets a flag; one thread sends at most one `gpufleet.replan` per
    `min_gap_s` (a plane flooding facts asks for one re-plan a `min_gap_s`, not one each). The beat timer
    re-plans anyway if a request is lost. The re-plan carries the request id of the first
    write it serves (the worker logs it with that id).
    """

    def __init__(self, send: Callable[[str], None], min_gap_s: float = 0.5) -> None:
        """`send(reason)` sends the task (the API: `controlplane.tasks.request_replan`
        without publish retries, imported in the thread: it starts without Celery)."""
        self._send = send
        self._wanted = threading.Event()
        self._reasons: set[str] = set()
        self._first_request: str | None = None
        self._lock = threading.Lock()
        self._min_gap_s = min_gap_s
        threading.Thread(target=self._run, name="replan-requests", daemon=True).start()

    def changed(self, kind: str) -> None:
        """An API write changed an object of ``kind``."""
        self.request(f"{kind} changed")

    def request(self, reason: str) -> None:
        with self._lock:
            self._reasons.add(reason)
            self._first_request = self._first_request or current_request_id()
        self._wanted.set()

    def _run(self) -> None:
        send = self._send
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
