"""NATS for every workload-plane process (agent, the router's load publisher, gateway):
connect and keep trying until it answers — each must start and serve while NATS is down
(static stability), then reconnects by itself for ever — and watch one KV key."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from controlplane.contracts import NatsCredentials, read_small_file, strip_userinfo

log = logging.getLogger(__name__)

Callback = Callable[..., Awaitable[None]]
MAX_CREDENTIALS_BYTES = 64 * 1024


class CredentialsFileError(ValueError):
    """The NATS credentials file is not ``{"user": …, "password": …}``; the message says
    what to change and never holds the password."""


def read_credentials(path: Path, user: str, inbox_prefix: str) -> NatsCredentials:
    """``{"user", "password"[, "inbox_prefix"]}`` from a JSON file; ``user`` and
    ``inbox_prefix`` are the defaults where it leaves them out."""
    try:
        raw = read_small_file(path, MAX_CREDENTIALS_BYTES)
    except OSError as exc:
        message = f"{path}: cannot read the NATS credentials ({exc.strerror})"
        raise CredentialsFileError(message) from None
    shape = '{"user": "...", "password": "..."}'
    if len(raw) > MAX_CREDENTIALS_BYTES:
        raise CredentialsFileError(f"{path}: over {MAX_CREDENTIALS_BYTES} bytes; write {shape}")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise CredentialsFileError(f"{path}: not a JSON object like {shape}")
    data = {"user": user, "inbox_prefix": inbox_prefix, **data}
    unknown = sorted(set(data) - {"user", "password", "inbox_prefix"})
    if unknown:
        raise CredentialsFileError(f"{path}: unknown field {unknown[0]!r}; write {shape}")
    bad = [k for k, v in data.items() if not isinstance(v, str) or not v]
    if bad or "password" not in data:
        field = bad[0] if bad else "password"
        raise CredentialsFileError(f"{path}: {field} must be a non-empty string; write {shape}")
    return NatsCredentials(**data)


async def connect_until_up(
    servers: str | Sequence[str],
    name: str,
    credentials: NatsCredentials | None,
    *,
    why_waiting: str,
    callbacks: dict[str, Callback] | None = None,
    first_delay_s: float = 0.05,
    max_delay_s: float = 2.0,
) -> Client:
    """A connected client; until then retries with doubling delays (``first_delay_s`` up to
    ``max_delay_s``), logging ``why_waiting`` (what the process does meanwhile) each time.
    ``callbacks``: nats.connect's ``reconnected_cb``, ``disconnected_cb``, ``error_cb``."""
    options: dict[str, Any] = credentials.connect_options() if credentials else {}
    delay = first_delay_s
    while True:
        try:
            return await nats.connect(
                servers,  # type: ignore[arg-type]
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.2,
                connect_timeout=2,
                **(callbacks or {}),
                **options,
            )
        except Exception as exc:
            shown = strip_userinfo(servers if isinstance(servers, str) else ",".join(servers))
            log.warning("cannot reach NATS at %s (%s); %s", shown, exc, why_waiting)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)


async def watch_key(
    js: JetStreamContext,
    old: JetStreamContext.PushSubscription | None,
    subject: str,
    stream: str,
    cb: Callable[[Msg], Awaitable[None]],
) -> JetStreamContext.PushSubscription:
    """(Re)watch one KV key: drop ``old``, then an ephemeral consumer filtered on the key's
    subject, delivering its last value and every new one, acking nothing (the value is the
    state; a lost delivery is repaired by the caller's resync). Raises what the server says
    (bucket missing, server busy): callers log it and retry."""
    if old is not None:
        with contextlib.suppress(Exception):
            await old.unsubscribe()
    config = ConsumerConfig(
        name=uuid.uuid4().hex,
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        inactive_threshold=30.0,
        mem_storage=True,
        num_replicas=1,
    )
    return await js.subscribe(subject, stream=stream, cb=cb, config=config)
