"""The worker's webhook export: every `GPUFLEET_EVENTS_WEBHOOK_EVERY_S` the beat sends
`gpufleet.export_webhook`; one run (one at a time: a session-level advisory lock, held
outside any transaction while the receiver is called) sends each stream's new rows in
bounded batches.

At least once: the cursor moves only after the receiver answered 2xx, so a crash between
the answer and the commit sends that batch again (alerts carry a stable `fingerprint` for
receivers that drop duplicates). A failure stops the stream's run and backs off (1 s, 2 s …
5 min); the rows wait in PostgreSQL, nothing is dropped — except a batch the receiver
refuses (4xx other than 408/429) `events_webhook_max_rejections` times in a row, which is
dead-lettered: skipped, counted (`gpufleet_webhook_dead_letters_total`), its row ids logged.
The URL (a Slack one holds a secret) and the token are never logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.session import transaction
from controlplane.procurement.store import key_lock
from controlplane.settings import Settings
from controlplane.webhook import core, store

log = logging.getLogger("gpufleet.webhook")

EXPORT_WEBHOOK = "gpufleet.export_webhook"
MAX_BATCHES_PER_RUN = 10

Post = Callable[[bytes], tuple[int | None, str]]
"""Sends one payload; returns the HTTP status (None: no answer) and what went wrong."""


def http_post(settings: Settings) -> Post:
    headers = {"content-type": "application/json", "user-agent": "gpufleet-webhook/1"}
    if settings.events_webhook_token is not None:
        headers["authorization"] = f"Bearer {settings.events_webhook_token.get_secret_value()}"

    def post(body: bytes) -> tuple[int | None, str]:
        try:
            with (
                httpx.Client(timeout=settings.events_webhook_timeout_s) as client,
                client.stream(
                    "POST", settings.events_webhook_url, content=body, headers=headers
                ) as answer,  # the status is all it needs: a body sent slowly is not waited for
            ):
                return answer.status_code, f"HTTP {answer.status_code}"
        except Exception as exc:  # an httpx error, or a URL it cannot use: never the worker's
            return None, f"no answer ({type(exc).__name__})"

    return post


def export(
    factory: sessionmaker[Session],
    settings: Settings,
    post: Post,
    now: datetime,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, int]:
    """Send what is new in each stream; returns how many alerts each delivered. ``clock``
    (seconds) bounds a run to about three POST timeouts per stream."""
    if not settings.events_webhook_url:
        return {}
    with key_lock(factory, store.LOCK_KEY) as mine:
        if not mine:
            return {}  # another run is sending
        return {s: _export_stream(factory, settings, post, now, s, clock) for s in store.STREAMS}


def _export_stream(
    factory: sessionmaker[Session],
    settings: Settings,
    post: Post,
    now: datetime,
    stream: str,
    clock: Callable[[], float],
) -> int:
    delivered = 0
    # a slow receiver must not hold the one worker (spot notices, acquires) for minutes:
    # the run stops after about three timeouts' worth; the next run goes on
    budget = clock() + 3 * settings.events_webhook_timeout_s
    for _ in range(MAX_BATCHES_PER_RUN):
        if clock() > budget:
            return delivered
        with transaction(factory) as session:
            cursor = store.cursor(session, stream)
            if cursor.next_attempt_at is not None and now < cursor.next_attempt_at:
                return delivered  # backing off
            after = (cursor.txid, cursor.row_id)
            entries = store.pending(session, stream, after, settings.events_webhook_max_alerts)
        if not entries:
            return delivered
        body, count = core.payload(stream, entries, settings.events_webhook_max_bytes)
        status, error = post(body)  # no transaction open
        outcome, last = core.outcome_of(status), entries[count - 1]
        with transaction(factory) as session:
            if outcome is core.Outcome.DELIVERED:
                store.record_delivered(session, stream, last, count)
                delivered += count
                continue
            rejected = outcome is core.Outcome.REJECTED
            attempts, rejections = store.record_failed(
                session, stream, error, lambda n: core.next_attempt(n, now), rejected=rejected
            )
            dead = rejected and rejections >= settings.events_webhook_max_rejections
            if dead:
                store.record_dead_letter(session, stream, last, count)
        if dead:
            log.error(
                "webhook: %d %s alert(s) dead-lettered after %d refusals (%s): rows %s … %s",
                *(count, stream, rejections, error, entries[0].row_id, last.row_id),
            )
        else:
            log.warning("webhook: %s batch not delivered (%s), try %d", stream, error, attempts)
        return delivered
    return delivered


def register(
    app: Celery, factory: Callable[[], sessionmaker[Session]], settings: Callable[[], Settings]
) -> None:
    @app.task(name=EXPORT_WEBHOOK, shared=False)
    def export_webhook() -> dict[str, int]:
        """Send new events and audit entries to the webhook (nothing when none is set)."""
        s = settings()
        if not s.events_webhook_url:
            return {}
        return export(factory(), s, http_post(s), datetime.now(UTC))
