"""The agent's memory across restarts: the last desired state, persisted atomically.

Static stability: with NATS or the control plane unreachable, the agent keeps reconciling
against this snapshot. Versions only move forward: ``should_apply`` refuses anything not
newer than what the agent already holds, so a late or replayed snapshot changes nothing.
A version is ``(epoch, generation)``: a snapshot of a newer epoch wins whatever its
generation, so the control plane can take a plane back from a generation it never issued
(a forged or corrupted 10^12) by starting a new epoch.

On disk: two slot files written in turn (``desired-state.0`` and ``.1``), each a header
line — magic, payload length, CRC-32 — then the snapshot's JSON. A save is one ``pwrite``
into a file kept open (about 1 µs here, against ~120 µs for temp file + rename: it is on
the desired → applied path). A crash or power loss in the middle of a write leaves a slot
whose CRC does not match; the other slot still holds the previous snapshot, and ``load``
takes the newest valid one. ``sync`` (fdatasync, off the hot path) makes it survive a power
loss. A ``desired-state.json`` left by an older agent is read too.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import zlib
from pathlib import Path
from typing import IO

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    RejectedMessageError,
    decode_desired,
    encode,
)

log = logging.getLogger(__name__)

STATE_FILE = "desired-state.json"
"""Where agents before the slot files kept the snapshot (read, never written)."""
SLOT_FILES = ("desired-state.0", "desired-state.1")
MAGIC = b"GPFDS1"


def frame(payload: bytes) -> bytes:
    """Header line + payload, as a slot holds it."""
    return b"%s %d %08x\n" % (MAGIC, len(payload), zlib.crc32(payload)) + payload


def unframe(data: bytes) -> bytes | None:
    """The payload of a slot, or None when it is empty, torn or not a slot at all."""
    head, sep, rest = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != MAGIC:
        return None
    try:
        length, crc = int(parts[1]), int(parts[2], 16)
    except ValueError:
        return None
    payload = rest[:length]
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


def should_apply(current: DesiredState | None, incoming: DesiredState, cluster: str) -> bool:
    """True if ``incoming`` is for this cluster and newer than ``current``: a newer epoch,
    or the same epoch and a higher generation."""
    if incoming.cluster != cluster:
        return False
    return current is None or incoming.version > current.version


KEPT_FILE = "kept-deployments.json"
"""The deployments the agent keeps through their disappearance grace (JSON list of
``DeploymentDesired``), for the router in a process of its own (``router.follower``)."""


def save_kept(state_dir: Path, deployments: list[DeploymentDesired]) -> None:
    """Write the kept deployments (temporary file + rename: never read half-written);
    best effort: the router then routes as the snapshot says."""
    path = Path(state_dir) / KEPT_FILE
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(
            frame(json.dumps([d.model_dump(mode="json") for d in deployments]).encode())
        )
        tmp.replace(path)
    except OSError as exc:
        log.error("cannot write %s: %s", path, exc)


def load_kept(state_dir: Path) -> list[DeploymentDesired]:
    """What ``save_kept`` wrote (none if nothing, torn or unreadable)."""
    try:
        payload = unframe((Path(state_dir) / KEPT_FILE).read_bytes())
        rows = json.loads(payload) if payload is not None else []
        return [DeploymentDesired.model_validate(r) for r in rows]
    except (OSError, ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return []


class DesiredStateStore:
    """Two slot files in ``state_dir`` written in turn (see the module docstring); fsync is
    a separate step so the agent can take it off the propagation path."""

    def __init__(self, state_dir: Path, *, fsync: bool = True) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        self._fsync = fsync
        self._fds: list[int] = []
        self._next = 0
        """The slot the next save writes: never the one holding the newest snapshot."""
        self._last = -1
        self._new_files = False

    def load(self, cluster: str | None = None) -> DesiredState | None:
        """The newest valid snapshot (of ``cluster`` when given: another plane's file copied
        into this folder is not acted on), or None if there is none (the others logged)."""
        found: list[tuple[tuple[int, int], int, DesiredState]] = []  # (version, slot, state)
        for slot, name in enumerate((*SLOT_FILES, STATE_FILE)):
            try:
                data = (self.state_dir / name).read_bytes()
            except FileNotFoundError:
                continue
            payload = data if name == STATE_FILE else unframe(data)
            if payload is None:
                log.warning("ignoring torn or empty %s", self.state_dir / name)
                continue
            try:
                state = decode_desired(payload)
            except RejectedMessageError as exc:
                log.error("ignoring unreadable %s (%s)", self.state_dir / name, exc)
                continue
            if cluster is not None and state.cluster != cluster:
                log.error(
                    "ignoring %s: a snapshot of cluster %s, not %s",
                    self.state_dir / name,
                    state.cluster,
                    cluster,
                )
                continue
            found.append((state.version, slot, state))
        if not found:
            return None
        _, slot, newest = max(found, key=lambda f: f[:2])
        self._next = 1 - slot if slot < len(SLOT_FILES) else 0
        return newest

    def save(self, state: DesiredState, raw: bytes | None = None) -> None:
        """Write the snapshot into the other slot. ``raw``: its encoded bytes when the
        caller has them (as received), so the hot path does not encode it again."""
        if not self._fds:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._new_files = not all((self.state_dir / n).exists() for n in SLOT_FILES)
            self._fds = [
                os.open(self.state_dir / n, os.O_RDWR | os.O_CREAT, 0o600) for n in SLOT_FILES
            ]
        data = memoryview(frame(raw if raw is not None else encode(state)))
        fd, offset = self._fds[self._next], 0
        while offset < len(data):  # a regular file takes it all at once; loop if short
            offset += os.pwrite(fd, data[offset:], offset)
        self._last, self._next = self._next, 1 - self._next

    def sync(self) -> None:
        """fdatasync the slot last written (and the directory once, after creating the
        files). No-op when the store was made with ``fsync=False``."""
        if not self._fsync or self._last < 0:
            return
        os.fdatasync(self._fds[self._last])
        if self._new_files:
            self._new_files = False
            dir_fd = os.open(self.state_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class StateDirInUseError(RuntimeError):
    """Another agent holds the state folder."""


def lock_state_dir(state_dir: Path) -> IO[str]:
    """An flock on ``state_dir/agent.lock`` for this process's lifetime (keep the returned
    file open): two agents on one folder would both take over its replicas, both start
    replicas toward the target and overwrite each other's records, leaking processes."""
    state_dir.mkdir(parents=True, exist_ok=True)
    handle = open(state_dir / "agent.lock", "a+")  # noqa: SIM115 - held while the agent runs
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(32).strip() or "?"
        handle.close()
        raise StateDirInUseError(
            f"another agent (pid {holder}) is running on {state_dir}; stop it first or give "
            "this one its own --state-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle
