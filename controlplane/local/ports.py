"""Loopback ports for the embedded servers: find a free one, check one, wait for one."""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports below the kernel's ephemeral range, so
    that no outgoing connection is handed one of them before a server binds it (a port that
    is merely free *now* inside that range can be). For tests that start servers on ports
    they choose in advance."""
    low, _ = _ephemeral_range()
    span = max(1, low - 20000 - count)
    start = 20000 + random.randrange(span)  # tests running side by side rarely collide
    for first in [*range(start, low - count), *range(20000, start)]:
        if all(port_is_free(first + i, host) for i in range(count)):
            return first
    raise OSError(f"no {count} consecutive free ports between 20000 and {low}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ServerExited(Exception):
    """The server whose port was awaited exited first."""


def wait_for_port(
    port: int,
    timeout_s: float = 10.0,
    host: str = "127.0.0.1",
    alive: Callable[[], bool] | None = None,
) -> None:
    """Until something answers on the port; ``alive`` (the server's process runs): stop
    waiting at once with ServerExited when it says False."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        if alive is not None and not alive():
            raise ServerExited(f"the server for {host}:{port} exited before it answered")
        time.sleep(0.02)
    raise TimeoutError(f"nothing answered on {host}:{port} within {timeout_s:.0f} s")
