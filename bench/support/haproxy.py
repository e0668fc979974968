"""HAProxy as the failover bench's peer, configured as a careful user would.

Active health checks every second (``option httpchk GET /health``, the plane router's
health route: 200 while it runs), two failed checks mark a plane down and two good ones
bring it back; ``observe layer7`` with ``on-error mark-down`` takes a plane out at its
third bad answer in a row without waiting for a check; ``retries 3`` with ``option
redispatch`` and ``retry-on all-retryable-errors`` (the request body is buffered so that it
can be resent) send a request whose plane failed before answering to another plane. Idle
connections to the planes are shared by every client (``http-reuse always``: the planes are
ours, so a request need not pay a new connection's round trip). The response says which
server answered (``x-gpufleet-plane``, as the gateway's does). ``option http-no-delay``
sends each streamed token at once (without it HAProxy corks small writes: +200 ms TTFT).
The binary is the Debian package, installed with apt-get when missing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

SERVER_TIMEOUT_S = 10
"""``timeout server``: inactivity on an answer (a stream's tokens come every 20-50 ms)."""


def haproxy_binary() -> str:
    """The haproxy binary, ``apt-get install -y haproxy`` first when it is missing."""
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if found:
        return found
    for argv in (
        ["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=300", "haproxy"],
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=300", "haproxy"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0 and argv[1] == "install":
            break
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if not found:
        raise SystemExit("haproxy is missing and `apt-get install -y haproxy` did not install it")
    return found


def render_config(
    port: int, servers: Sequence[tuple[str, int]], balance: str = "roundrobin"
) -> str:
    """The whole haproxy.cfg: one frontend on ``127.0.0.1:port``, one backend of
    ``(name, port)`` servers on loopback (each a plane's delay proxy)."""
    lines = [
        "global",
        "    maxconn 4096",
        "    nbthread 1",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        "    timeout client 60s",
        f"    timeout server {SERVER_TIMEOUT_S}s",
        "    timeout check 1s",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on all-retryable-errors",
        "    option http-buffer-request",
        "    http-reuse always",
        "    option http-no-delay",
        "frontend fleet",
        f"    bind 127.0.0.1:{port}",
        "    default_backend planes",
        "backend planes",
        f"    balance {balance}",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        "    default-server inter 1s fall 2 rise 2 observe layer7 error-limit 3 on-error mark-down",
        "    http-response set-header x-gpufleet-plane %[srv_name]",
    ]
    lines += [f"    server {name} 127.0.0.1:{p} check" for name, p in servers]
    return "\n".join(lines) + "\n"


class HAProxy:
    """One haproxy process in the foreground (``-db``), stopped with its group."""

    def __init__(
        self,
        workdir: Path,
        port: int,
        servers: Sequence[tuple[str, int]],
        balance: str = "roundrobin",
    ) -> None:
        self.port = port
        self.config = workdir / f"haproxy-{port}.cfg"
        self.config.write_text(render_config(port, servers, balance))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HAProxy:
        exe = haproxy_binary()
        check = subprocess.run(
            [exe, "-c", "-f", str(self.config)], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise SystemExit(f"haproxy rejects {self.config}: {check.stderr or check.stdout}")
        self.proc = subprocess.Popen(
            [exe, "-db", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(0.2)
        if self.proc.poll() is not None:
            raise SystemExit(f"haproxy exited with {self.proc.returncode} ({self.config})")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
