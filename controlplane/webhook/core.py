"""The webhook export's decisions, pure: an event or audit entry as an Alertmanager alert,
alerts into a bounded payload (Alertmanager's webhook format, version 4, which its
receivers — PagerDuty and Slack bridges among them — accept), what an answer means, and the
backoff. No I/O, no clock: callers pass ``now``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not resolved"
MAX_ANNOTATION = 1024
BACKOFF_FIRST = timedelta(seconds=1)
BACKOFF_MAX = timedelta(minutes=5)
_WARNING_WORDS = ("Failed", "Down", "Rejected", "TooLarge", "Triggered", "Interrupt")
_WARNING_WORDS += ("Suspended", "Lost", "Blocked", "Stale")


@dataclass(frozen=True)
class Entry:
    """A row to export, as plain data: its place in the stream and its alert."""

    txid: int
    row_id: str
    alert: dict[str, Any]


def _cut(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= MAX_ANNOTATION else text[:MAX_ANNOTATION] + "…"


def _rfc3339(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def severity_of(event_type: str) -> str:
    """``warning`` for what went wrong (failed, down, rejected …), else ``info``: receivers
    route on it (page on warning, post info to a channel)."""
    return "warning" if any(w in event_type for w in _WARNING_WORDS) else "info"


def event_alert(
    row_id: str,
    at: datetime,
    event_type: str,
    object_kind: str,
    object_name: str | None,
    message: str,
) -> dict[str, Any]:
    labels = {
        "alertname": f"gpufleet{event_type}",
        "source": "gpufleet",
        "stream": "event",
        "type": event_type,
        "object_kind": object_kind,
        "object_name": object_name or "",
        "severity": severity_of(event_type),
    }
    annotations = {"summary": _cut(message), "event_id": row_id}
    return _alert(labels, annotations, at, f"event-{row_id}")


def audit_alert(
    row_id: str,
    at: datetime,
    actor: str,
    action: str,
    kind: str,
    name: str | None,
    changed: list[str],
    request_id: str | None,
) -> dict[str, Any]:
    """Who did what to which object, and the names of the fields that changed — never
    their values (a spec may hold what only its owners should read)."""
    labels = {
        "alertname": "gpufleetAudit",
        "source": "gpufleet",
        "stream": "audit",
        "action": action,
        "object_kind": kind,
        "object_name": name or "",
        "severity": "info",
    }
    summary = f"{actor} {action}d {kind} {name or ''}".strip()
    annotations = {"summary": _cut(summary), "actor": _cut(actor), "audit_id": row_id}
    if changed:
        annotations["changed_fields"] = _cut(", ".join(changed))
    if request_id:
        annotations["request_id"] = request_id
    return _alert(labels, annotations, at, f"audit-{row_id}")


def _alert(
    labels: dict[str, str], annotations: dict[str, str], at: datetime, fingerprint: str
) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": labels,
        "annotations": annotations,
        "startsAt": _rfc3339(at),
        "endsAt": ZERO_TIME,
        "generatorURL": "",
        "fingerprint": fingerprint,
    }


def changed_fields(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str]:
    before, after = before or {}, after or {}
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def payload(stream: str, entries: list[Entry], max_bytes: int) -> tuple[bytes, int]:
    """The JSON body for the longest prefix of ``entries`` that fits in ``max_bytes``, and
    how many it holds (at least one: each alert is bounded far below any allowed limit)."""
    group = {"stream": stream}
    document: dict[str, Any] = {
        "version": "4",
        "groupKey": f'{{}}:{{stream="{stream}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "gpufleet",
        "groupLabels": group,
        "commonLabels": {"source": "gpufleet", "stream": stream},
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": [],
    }
    empty = len(json.dumps(document).encode())
    size, count = empty, 0
    for entry in entries:
        piece = len(json.dumps(entry.alert).encode()) + 2
        if count and size + piece > max_bytes:
            break
        size, count = size + piece, count + 1
    document["alerts"] = [e.alert for e in entries[:count]]
    return json.dumps(document).encode(), count


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    """The receiver is down, slow or busy: try the same batch again after the backoff."""
    REJECTED = "rejected"
    """The receiver refuses the batch: again after the backoff, dead-lettered at the limit."""


RECEIVER_WRONG = frozenset({401, 403, 404, 405, 407, 408, 421, 425, 429})
"""Statuses that say the receiver (its token, path, proxy or load) is wrong, not the batch:
retried with the backoff and never dead-lettered (a rotated token dead-lettered every batch
until someone noticed)."""


def outcome_of(status: int | None) -> Outcome:
    """``status``: the answer's HTTP status, None when no answer came. A redirect counts as
    the receiver's (the export follows none: fix the URL)."""
    if status is not None and 200 <= status < 300:
        return Outcome.DELIVERED
    if status is None or status < 400 or status in RECEIVER_WRONG or status >= 500:
        return Outcome.RETRY
    return Outcome.REJECTED


def next_attempt(attempts: int, now: datetime) -> datetime:
    """After the ``attempts``-th failure in a row: 1 s, 2 s, 4 s … at most 5 min."""
    delay = min(BACKOFF_FIRST * 2 ** min(max(attempts - 1, 0), 20), BACKOFF_MAX)
    return now + delay
