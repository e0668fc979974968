"""The agent's memory across restarts: the last desired state, persisted atomically.

Static stability: with NATS or the control plane unreachable, the agent keeps reconciling
against this snapshot. Generations only move forward: ``should_apply`` refuses anything
not newer than what the agent already holds, so a late or replayed snapshot changes nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from controlplane.contracts import DesiredState, RejectedMessageError, decode_desired, encode

log = logging.getLogger(__name__)

STATE_FILE = "desired-state.json"


def should_apply(current: DesiredState | None, incoming: DesiredState, cluster: str) -> bool:
    """True if ``incoming`` is for this cluster and newer than ``current``."""
    if incoming.cluster != cluster:
        return False
    return current is None or incoming.generation > current.generation


class DesiredStateStore:
    """One JSON file in ``state_dir``, replaced atomically; fsync is a separate step so the
    agent can take it off the propagation path."""

    def __init__(self, state_dir: Path, *, fsync: bool = True) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        self._fsync = fsync

    def load(self) -> DesiredState | None:
        """The saved snapshot, or None if there is none or it cannot be read (logged)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode_desired(data)
        except RejectedMessageError as exc:
            log.error("ignoring unreadable %s (%s); waiting for the control plane", self.path, exc)
            return None

    def save(self, state: DesiredState) -> None:
        """Atomically replace the file (temp file + rename): a crash of the agent never
        leaves a torn snapshot. Call ``sync`` to make it survive a power loss too."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # one fixed temp name: the agent is the only writer (under its lock), and it saves
        # on the propagation path, where mkstemp's random names cost ~20 % more
        tmp = self.state_dir / ".desired.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                data = memoryview(encode(state))
                while data:  # a regular file takes it all at once, but write may be short
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def sync(self) -> None:
        """fsync the file and its directory (slow on some disks: ~12 ms here). No-op when
        the store was made with ``fsync=False``."""
        if not self._fsync or not self.path.exists():
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
