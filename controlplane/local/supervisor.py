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

from controlplane.contracts import secret_env, strip_userinfo

REPO = Path(__file__).resolve().parents[2]


class UpError(RuntimeError):
    """`up` cannot start; the message says what to change."""


HEALTHY_AFTER_S = 60.0
"""A child that ran this long before it exited starts again after the shortest backoff."""

MAX_BACKOFF_S = 30.0


def restart_delay(restarts: int) -> float:
    """Backoff before the `restarts`-th restart in a row: 1, 2, 4 … 30 s."""
    return min(MAX_BACKOFF_S, 0.5 * 2**restarts)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process's whole group (it leads one: `start_new_session`), SIGKILL what is
    left after `grace_s`. The group outlives its leader: a killed uvicorn master leaves its
    workers serving in it, which this stops too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    while time.monotonic() < deadline and _group_alive(proc.pid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(grace_s)


def _group_alive(pgid: int) -> bool:
    """Whether a process other than a zombie is still in the group (Linux /proc: a zombie
    still counts for kill(2), and an orphan's zombie may wait long for its reaper)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


CONTROL_PLANE_SECRETS = frozenset(
    {"GPUFLEET_NATS_USER", "GPUFLEET_NATS_PASSWORD", "GPUFLEET_DATABASE_URL", "GPUFLEET_REDIS_URL"}
)
"""What `up` gives the control plane's processes and no workload-plane one: the NATS user
that may write every plane's desired state, the database, the broker."""


@dataclass
class Child:
    """A supervised process in a process group of its own: restarted with backoff when it
    exits unexpectedly (what it left in its group is stopped first), stopped with its group."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    after_stop: Callable[[], None] | None = None
    """Runs after the process stopped (e.g. stop the replicas an agent leaves for adoption)."""
    plane: bool = False
    """A workload-plane process (agent, router, gateway): it gets none of the control
    plane's credentials (``CONTROL_PLANE_SECRETS``); it has its own NATS user's file."""
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = 0.0

    def start(self, base_env: dict[str, str], log_dir: Path, now: float) -> None:
        log = open(log_dir / f"{self.name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            if self.plane:  # nor the operator's cloud keys and the like (secret_env)
                base_env = {
                    k: v
                    for k, v in base_env.items()
                    if k not in CONTROL_PLANE_SECRETS and not secret_env(k)
                }
            env = {**base_env, **self.env}
            if self.plane and "GPUFLEET_NATS_URL" in env:  # a user:password there is not its
                env["GPUFLEET_NATS_URL"] = strip_userinfo(env["GPUFLEET_NATS_URL"])
            self.process = subprocess.Popen(
                self.argv,
                env=env,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd=REPO,
            )
        finally:
            log.close()
        self.started_at = now

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exited(self) -> bool:
        """It was started and has exited (not yet reaped by `reap`)."""
        return self.process is not None and self.process.poll() is not None

    def reap(self, now: float, grace_s: float = 2.0) -> str:
        """After an unexpected exit: stop what the process left in its group, and schedule
        the restart (the backoff starts over after a healthy run). Returns what happened."""
        proc = self.process
        assert proc is not None
        code = proc.returncode
        stop_group(proc, grace_s)
        self.process = None
        if now - self.started_at >= HEALTHY_AFTER_S:
            self.restarts = 0
        self.restarts += 1
        delay = restart_delay(self.restarts)
        self.next_start = now + delay
        return f"{self.name} exited ({code}); restarting in {delay:.0f} s"

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.process
        if proc is None:
            return
        stop_group(proc, timeout_s)
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
