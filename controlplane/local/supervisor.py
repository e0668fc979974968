"""Supervision primitives for `gpufleet up`: a restartable child process, the one-`up`-per-
data-directory lock, and stopping the replicas an agent leaves behind for adoption."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class UpError(RuntimeError):
    """`up` cannot start; the message says what to change."""


@dataclass
class Child:
    """A supervised process: restarted with backoff when it exits unexpectedly."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    after_stop: Callable[[], None] | None = None
    """Runs after the process stopped (e.g. stop the replicas an agent leaves for adoption)."""
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0

    def start(self, base_env: dict[str, str], log_dir: Path) -> None:
        log = open(log_dir / f"{self.name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(
                self.argv,
                env={**base_env, **self.env},
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd=REPO,
            )
        finally:
            log.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout_s)
        self.process = None
        if self.after_stop is not None:
            self.after_stop()


def stop_recorded_replicas(runtime_dir: Path, grace_s: float = 10.0) -> None:
    """An agent leaves its replicas running for the next agent to adopt; `up` stopping for
    good stops them too (SIGTERM to each replica's process group, SIGKILL after `grace_s`)."""
    record = runtime_dir / "replicas.json"
    if not record.exists():
        return
    pids = [int(r["pid"]) for r in json.loads(record.read_text()) if r.get("pid")]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + grace_s
        while (
            sig == signal.SIGTERM and time.monotonic() < deadline and any(_alive(p) for p in pids)
        ):
            time.sleep(0.05)
    record.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DataDirLock:
    """An flock on DATA_DIR/up.lock: one `up` per data directory; released at exit."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "up.lock"
        self._fh: Any = None

    def acquire(self) -> None:
        self._fh = open(self.path, "a+")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "?"
            self._fh.close()
            raise UpError(
                f"another `gpufleet up` (pid {holder}) is running on {self.path.parent}; stop it "
                "first or use another --data-dir"
            ) from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()

    def release(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._fh.close()
            self._fh = None
