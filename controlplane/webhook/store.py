"""The webhook export's SQL: each stream's cursor, what is new since it, and the counts.

The cursor is ``(txid, row id)``: rows are read in the order of the transaction that wrote
them, and only from transactions older than every one still running
(``pg_snapshot_xmin``). A transaction that commits late — it started before rows already
sent — therefore holds the cursor back until it ends, and its rows are never skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text, tuple_
from sqlalchemy.orm import Session

from controlplane.db.models import AuditEntry, Event, WebhookCursor
from controlplane.webhook.core import Entry, audit_alert, changed_fields, event_alert

STREAMS = ("event", "audit")
LOCK_KEY = "gpufleet-webhook-export"


def horizon(session: Session) -> int:
    """Every transaction with a smaller id has ended."""
    return int(
        session.scalar(text("SELECT (pg_snapshot_xmin(pg_current_snapshot())::text)::bigint"))
    )


def cursor(session: Session, stream: str) -> WebhookCursor:
    """The stream's cursor. The first one starts at the horizon — rows of transactions that
    ran then or later — so rows written before the export was configured are not sent."""
    row = session.get(WebhookCursor, stream)
    if row is None:
        row = WebhookCursor(
            stream=stream,
            txid=horizon(session),
            row_id="",
            attempts=0,
            rejections=0,
            delivered=0,
            failed_attempts=0,
            dead_letters=0,
        )
        session.add(row)
        session.flush()
    return row


def pending(session: Session, stream: str, after: tuple[int, str], limit: int) -> list[Entry]:
    """Up to ``limit`` rows past ``after`` (a cursor), oldest transaction first."""
    model = Event if stream == "event" else AuditEntry
    ceiling = horizon(session)
    rows = session.scalars(
        select(model)
        .where(model.txid.is_not(None), model.txid < ceiling)
        .where(tuple_(model.txid, model.id) > tuple_(*after))
        .order_by(model.txid, model.id)
        .limit(limit)
    ).all()
    return [_entry(r) for r in rows]


def _entry(row: Event | AuditEntry) -> Entry:
    assert row.txid is not None
    if isinstance(row, Event):
        alert = event_alert(
            row.id, row.time, row.type, row.object_kind, row.object_name, row.message
        )
    else:
        changed = changed_fields(row.before, row.after)
        alert = audit_alert(
            row.id,
            row.time,
            row.actor,
            row.action,
            row.resource_kind,
            row.resource_name,
            changed,
            row.request_id,
        )
    return Entry(row.txid, row.id, alert)


def record_delivered(session: Session, stream: str, last: Entry, count: int) -> None:
    row = session.get_one(WebhookCursor, stream, with_for_update=True)
    row.txid, row.row_id = last.txid, last.row_id
    row.attempts, row.rejections, row.next_attempt_at, row.last_error = 0, 0, None, None
    row.delivered += count


def record_failed(
    session: Session,
    stream: str,
    error: str,
    retry_at: Callable[[int], datetime],
    *,
    rejected: bool,
) -> tuple[int, int]:
    """One more failed try of the batch at the cursor (``rejected``: the receiver refused
    it), next tried at ``retry_at(failures in a row)``; returns the failures in a row and
    the refusals in a row (any other failure resets those)."""
    row = session.get_one(WebhookCursor, stream, with_for_update=True)
    row.attempts += 1
    row.rejections = row.rejections + 1 if rejected else 0
    row.failed_attempts += 1
    row.next_attempt_at, row.last_error = retry_at(row.attempts), error[:255]
    return row.attempts, row.rejections


def record_dead_letter(session: Session, stream: str, last: Entry, count: int) -> None:
    """Skip the refused batch (its rows stay in their table) and count it."""
    row = session.get_one(WebhookCursor, stream, with_for_update=True)
    row.txid, row.row_id = last.txid, last.row_id
    row.attempts, row.rejections, row.next_attempt_at = 0, 0, None
    row.dead_letters += count


@dataclass(frozen=True)
class StreamCounts:
    stream: str
    delivered: int
    failed_attempts: int
    dead_letters: int
    failures_in_a_row: int


def counts(session: Session) -> list[StreamCounts]:
    """Every stream's counts (for /metrics)."""
    rows = session.scalars(select(WebhookCursor).order_by(WebhookCursor.stream))
    return [
        StreamCounts(r.stream, r.delivered, r.failed_attempts, r.dead_letters, r.attempts)
        for r in rows
    ]


def backlog(session: Session, stream: str, after: tuple[int, str]) -> int:
    model = Event if stream == "event" else AuditEntry
    query = select(func.count()).where(
        model.txid.is_not(None), tuple_(model.txid, model.id) > tuple_(*after)
    )
    return int(session.scalar(query) or 0)
