"""The export of events and audit entries to a webhook, against the real PostgreSQL and a
real HTTP receiver on loopback: Alertmanager's payload, nothing before the export was
configured, a receiver that fails first loses nothing and gets no duplicate, bounded
batches, a late commit is never skipped, a refused batch is dead-lettered and counted."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from controlplane.settings import Settings
from controlplane.webhook.tasks import export, http_post
from gpufleet_logging import configure_logging
from gpufleet_logging.configure import ADOPTED_LOGGERS, QUIET_LOGGERS
from tests.integration.api import builders as b

pytestmark = pytest.mark.integration
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Receiver:
    """A webhook on loopback: answers each POST with the next of ``answers`` (then 200)
    and keeps what it accepted."""

    def __init__(self) -> None:
        self.answers: list[int] = []
        self.accepted: list[dict[str, Any]] = []
        self.posts: list[tuple[int, str | None]] = []  # (answer, Authorization)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                status = receiver.answers.pop(0) if receiver.answers else 200
                receiver.posts.append((status, self.headers.get("authorization")))
                if status == 200:
                    receiver.accepted.append(json.loads(body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, Any]]:
        return [a for payload in self.accepted for a in payload["alerts"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def worker_log() -> Iterator[io.StringIO]:
    """This process logs as the worker does, at DEBUG, into a buffer (put back after)."""
    loggers = [logging.getLogger(n) for n in ("", *ADOPTED_LOGGERS, *QUIET_LOGGERS)]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    buffer = io.StringIO()
    configure_logging("worker", env={"GPUFLEET_LOG_LEVEL": "DEBUG"}, stream=buffer)
    yield buffer
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


def _settings(url: str, **kw: Any) -> Settings:
    return Settings(events_webhook_url=url, events_webhook_token=SecretStr("hook-secret"), **kw)


def _event(factory: sessionmaker[Session], n: int = 1, type_: str = "ReplicaFailed") -> None:
    with factory() as s, s.begin():
        for i in range(n):
            s.add(m.Event(type=type_, object_kind="Cluster", object_name="use1-a",
                          message=f"replica {i} failed: exit 137"))  # fmt: skip


def _run(factory: sessionmaker[Session], settings: Settings, now: datetime) -> dict[str, int]:
    return export(factory, settings, http_post(settings), now)


def _cursor(factory: sessionmaker[Session], stream: str) -> m.WebhookCursor:
    with factory() as s:
        row = s.get_one(m.WebhookCursor, stream)
        s.expunge(row)
        return row


def test_new_events_and_audit_entries_arrive_as_alertmanager_payloads(
    admin: Any, session_factory: sessionmaker[Session], receiver: Receiver
) -> None:
    settings = _settings(receiver.url)
    b.seed(admin)  # before the export was configured: history, not sent
    _event(session_factory, type_="ClusterHealthy")
    assert _run(session_factory, settings, T0) == {"event": 0, "audit": 0}
    assert receiver.posts == []

    admin.post("deployments", b.deployment(), **{"X-Request-Id": "req-hook-1"})
    _event(session_factory)
    assert _run(session_factory, settings, T0) == {"event": 1, "audit": 1}

    payloads = {p["groupLabels"]["stream"]: p for p in receiver.accepted}
    for payload in payloads.values():
        assert payload["version"] == "4" and payload["status"] == "firing"
        assert {"groupKey", "receiver", "commonLabels", "externalURL", "alerts"} <= set(payload)
    (event,) = payloads["event"]["alerts"]
    assert event["labels"]["alertname"] == "gpufleetReplicaFailed"
    assert event["labels"]["severity"] == "warning" and event["labels"]["object_name"] == "use1-a"
    assert event["annotations"]["summary"] == "replica 0 failed: exit 137"
    assert event["status"] == "firing" and event["endsAt"] == "0001-01-01T00:00:00Z"
    datetime.fromisoformat(event["startsAt"].replace("Z", "+00:00"))
    (audit,) = payloads["audit"]["alerts"]
    assert audit["labels"]["action"] == "create" and audit["labels"]["object_kind"] == "Deployment"
    assert audit["annotations"]["request_id"] == "req-hook-1"
    assert "priority" in audit["annotations"]["changed_fields"]
    assert {auth for _, auth in receiver.posts} == {"Bearer hook-secret"}
    assert _run(session_factory, settings, T0) == {"event": 0, "audit": 0}  # nothing twice


def test_a_receiver_that_fails_first_gets_everything_once_after_the_backoff(
    tokens: Any,
    session_factory: sessionmaker[Session],
    receiver: Receiver,
    worker_log: io.StringIO,
) -> None:
    settings = _settings(receiver.url)
    _run(session_factory, settings, T0)  # the cursors start here
    _event(session_factory, 3)
    receiver.answers = [503, 503]  # down, then up

    assert _run(session_factory, settings, T0)["event"] == 0
    assert _cursor(session_factory, "event").next_attempt_at == T0 + timedelta(seconds=1)
    assert _run(session_factory, settings, T0 + timedelta(seconds=0.5))["event"] == 0
    assert len(receiver.posts) == 1  # backing off: not even tried
    assert _run(session_factory, settings, T0 + timedelta(seconds=1))["event"] == 0
    assert _cursor(session_factory, "event").next_attempt_at == T0 + timedelta(seconds=3)
    _event(session_factory, 2)  # more arrive while it is down
    assert _run(session_factory, settings, T0 + timedelta(seconds=3))["event"] == 5

    summaries = [a["annotations"]["summary"] for a in receiver.alerts()]
    assert sorted(summaries) == sorted(f"replica {i} failed: exit 137" for i in (0, 1, 2, 0, 1))
    assert len({a["fingerprint"] for a in receiver.alerts()}) == 5
    cursor = _cursor(session_factory, "event")
    assert (cursor.delivered, cursor.failed_attempts, cursor.attempts) == (5, 2, 0)
    assert [status for status, _ in receiver.posts] == [503, 503, 200]
    said = worker_log.getvalue()  # the worker's own log, at DEBUG
    assert "event batch not delivered (HTTP 503), try 2" in said
    assert "hook-secret" not in said and f"{receiver.server.server_port}/hook" not in said


def test_no_answer_at_all_is_retried_too(tokens: Any, session_factory: sessionmaker[Session]) -> None:  # fmt: skip
    closed = Receiver()
    settings = _settings(closed.url, events_webhook_timeout_s=2.0)
    _run(session_factory, settings, T0)
    closed.close()  # nothing listens there any more
    _event(session_factory)
    assert _run(session_factory, settings, T0)["event"] == 0
    cursor = _cursor(session_factory, "event")
    assert cursor.attempts == 1 and cursor.last_error == "no answer (ConnectError)"


def test_batches_are_bounded_in_alerts_and_bytes(
    tokens: Any, session_factory: sessionmaker[Session], receiver: Receiver
) -> None:
    settings = _settings(receiver.url, events_webhook_max_alerts=40)
    _run(session_factory, settings, T0)
    _event(session_factory, 100)
    assert _run(session_factory, settings, T0)["event"] == 100
    assert [len(p["alerts"]) for p in receiver.accepted] == [40, 40, 20]

    receiver.accepted.clear()
    small = _settings(receiver.url, events_webhook_max_bytes=16 * 1024)
    _event(session_factory, 100)
    assert _run(session_factory, small, T0)["event"] == 100
    sizes = [len(json.dumps(p).encode()) for p in receiver.accepted]
    assert len(sizes) > 1 and max(sizes) <= 16 * 1024, sizes
    assert len(receiver.alerts()) == 100


def test_a_transaction_that_commits_late_is_not_skipped(
    tokens: Any, session_factory: sessionmaker[Session], receiver: Receiver
) -> None:
    settings = _settings(receiver.url)
    _run(session_factory, settings, T0)
    slow = session_factory()
    slow.begin()
    slow.add(m.Event(type="Slow", object_kind="Cluster", message="written first, committed last"))
    slow.flush()  # its transaction has its id now, below the next one's
    _event(session_factory)  # committed at once
    try:
        assert _run(session_factory, settings, T0)["event"] == 0  # held back by the open one
    finally:
        slow.commit()
        slow.close()
    assert _run(session_factory, settings, T0)["event"] == 2
    assert [a["labels"]["type"] for a in receiver.alerts()] == ["Slow", "ReplicaFailed"]


def test_a_refused_batch_is_dead_lettered_counted_and_the_rest_flows(
    admin: Any, session_factory: sessionmaker[Session], receiver: Receiver
) -> None:
    settings = _settings(receiver.url, events_webhook_max_rejections=2)
    _run(session_factory, settings, T0)
    _event(session_factory, 2)
    receiver.answers = [400, 400]
    assert _run(session_factory, settings, T0)["event"] == 0
    assert _run(session_factory, settings, T0 + timedelta(seconds=1))["event"] == 0
    cursor = _cursor(session_factory, "event")
    assert (cursor.dead_letters, cursor.attempts, cursor.delivered) == (2, 0, 0)
    _event(session_factory, 1)
    assert _run(session_factory, settings, T0 + timedelta(seconds=1))["event"] == 1

    metrics = admin.get("/metrics").text
    assert 'gpufleet_webhook_dead_letters_total{stream="event"} 2.0' in metrics
    assert 'gpufleet_webhook_delivered_total{stream="event"} 1.0' in metrics
    assert 'gpufleet_webhook_failed_attempts_total{stream="event"} 2.0' in metrics
    assert 'gpufleet_webhook_consecutive_failures{stream="event"} 0.0' in metrics


def test_only_refusals_in_a_row_dead_letter_a_batch(
    tokens: Any, session_factory: sessionmaker[Session], receiver: Receiver
) -> None:
    """Four 503s (a receiver restarting) then one 400 counted five failures, the limit, and
    the alerts were dropped after a single refusal. A 401 (a rotated token) is never a
    refusal of the batch: it waits for the receiver to be fixed."""
    settings = _settings(receiver.url, events_webhook_max_rejections=3)
    _run(session_factory, settings, T0)
    _event(session_factory, 1)
    receiver.answers = [503, 503, 503, 503, 400, 401, 401, 401, 401, 400, 400]
    at = T0
    for _ in range(11):
        _run(session_factory, settings, at)
        at += timedelta(hours=1)  # past any backoff
    cursor = _cursor(session_factory, "event")
    assert (cursor.dead_letters, cursor.delivered) == (0, 0)  # 2 refusals in a row, not 3
    receiver.answers = [400]
    _run(session_factory, settings, at)
    assert _cursor(session_factory, "event").dead_letters == 1


def test_no_url_no_export(tokens: Any, session_factory: sessionmaker[Session]) -> None:
    assert export(session_factory, Settings(), lambda body: (200, ""), T0) == {}
    with session_factory() as s:
        assert s.query(m.WebhookCursor).count() == 0


def test_a_slow_receiver_holds_a_run_to_its_budget_not_the_worker(
    tokens: Any, session_factory: sessionmaker[Session]
) -> None:
    """One run sent up to 10 batches a stream whatever each took: a receiver answering in
    8 s held the one worker (spot notices, acquires) for minutes."""
    settings = _settings("http://127.0.0.1:9/hook", events_webhook_max_alerts=1,
                         events_webhook_timeout_s=10.0)  # fmt: skip
    now = [0.0]
    sent: list[bytes] = []

    def slow(body: bytes) -> tuple[int | None, str]:
        sent.append(body)
        now[0] += 8.0  # each POST takes 8 s
        return 200, "HTTP 200"

    export(session_factory, settings, slow, T0, clock=lambda: now[0])  # the cursor starts
    _event(session_factory, 10)
    delivered = export(session_factory, settings, slow, T0, clock=lambda: now[0])
    assert delivered["event"] == 4  # 0, 8, 16, 24 s: the fifth would start past 30 s
    assert export(session_factory, settings, slow, T0, clock=lambda: now[0])["event"] == 4


def test_a_receiver_that_sends_its_body_slowly_is_not_waited_for(
    tokens: Any, session_factory: sessionmaker[Session]
) -> None:
    """Its status is all the export needs; httpx's timeout is per read, so a body sent a
    byte every few seconds held the POST (and the worker) for good."""
    import socket
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        while not stop.wait(0.5):  # a byte every half second, never the whole body
            with contextlib.suppress(OSError):
                conn.sendall(b"x")
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    settings = _settings(f"http://127.0.0.1:{port}/hook", events_webhook_timeout_s=2.0)
    try:
        started = time.monotonic()
        status, _ = http_post(settings)(b"{}")
        assert status == 200 and time.monotonic() - started < 2.0
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data", "http://metadata.google.internal/x",
            "ftp://alerts.example/hook", "http://[::1"],
)  # fmt: skip
def test_a_receiver_url_that_is_no_receiver_is_refused_at_start(url: str) -> None:
    """A metadata address (the worker's own credentials), another scheme, or a URL httpx
    cannot use (which then failed every run with the cursor looking healthy)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="events_webhook_url"):
        Settings(events_webhook_url=url)
