"""ProcessRuntime: one vLLM-compatible server process per replica on this node.

Lifecycle of a replica: ``starting`` (after a backoff if its deployment's replicas keep
failing; launched in its own session on a free port with its GPUs) → ``ready`` once
``/health`` and ``/v1/models`` answer 200 → watched: vLLM exits 0 when its engine dies, so
the exit code means nothing and health is what counts — an exit or ``unhealthy_after``
failed checks in a row make it ``failed`` (its process group is killed). Reconcile then
stops it and starts a replacement (whose launch waits out the backoff). ``drain`` marks it
``draining`` (the router stops sending to it), waits for its in-flight requests up to the
deadline, then SIGTERM, then SIGKILL. Replicas are recorded in ``state_dir/replicas.json``
(with their state, rewritten on every change) so a restarted agent adopts the processes that
still run instead of restarting them, and so the plane's router, a process of its own, keeps
its replica table from it (``read_replicas``) whether the agent runs or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from controlplane.contracts import ReplicaState, ReplicaStatus, RevisionSpec, secret_env, utcnow
from workloadplane.runtime.base import InFlightCounter, ReplicaWatcher
from workloadplane.runtime.gpus import GpuAllocator
from workloadplane.runtime.templates import CommandTemplate

log = logging.getLogger(__name__)


@dataclass
class ProcessConfig:
    host: str = "127.0.0.1"
    startup_timeout_s: float = 600.0
    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    unhealthy_after: int = 3
    drain_timeout_s: float = 30.0
    stop_grace_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    stable_after_s: float = 60.0
    """A replica ready this long resets its deployment's failure count."""


@dataclass
class _Replica:
    replica_id: str
    deployment: str
    spec: RevisionSpec
    port: int
    gpus: list[str]
    pool: str | None = None
    instance: str | None = None
    serves: str = ""
    """A rollout lane's replica: the model name it answers (its deployment's)."""
    state: ReplicaState = "starting"
    pid: int | None = None
    identity: str | None = None
    """The process's boot id and start time (``process_identity``): a pid alone may be
    another process after a reboot or in a new pid namespace."""
    proc: asyncio.subprocess.Process | None = None
    started_at: datetime = field(default_factory=utcnow)
    ready_at: float | None = None
    reason: str = ""
    task: asyncio.Task[None] | None = None

    def status(self, host: str) -> ReplicaStatus:
        return ReplicaStatus(
            replica_id=self.replica_id,
            deployment=self.deployment,
            revision=self.spec.revision,
            state=self.state,
            endpoint=f"http://{host}:{self.port}",
            started_at=self.started_at,
            pool=self.pool,
            instance=self.instance,
            serves=self.serves,
        )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ProcessRuntime:
    def __init__(
        self,
        template: CommandTemplate,
        state_dir: Path,
        *,
        config: ProcessConfig | None = None,
        gpus: GpuAllocator | None = None,
        clock: Callable[[], float] = time.monotonic,
        watcher: ReplicaWatcher | None = None,
        in_flight: InFlightCounter | None = None,
    ) -> None:
        """``watcher`` is told of every state change (the plane's router and reconcile
        loop follow at once); ``in_flight`` is what a drain waits on to reach 0 (the
        router's counts; without one a drain stops the replica at once)."""
        self.template = template
        self.state_dir = Path(state_dir)
        self.config = config or ProcessConfig()
        self.gpus = gpus or GpuAllocator.for_this_machine()
        self.clock = clock
        self._watcher = watcher
        self._in_flight = in_flight
        self._replicas: dict[str, _Replica] = {}
        self._failures: dict[str, int] = {}
        self._seq = 0
        self._adopted = False
        self._save_failed = False
        self._client = httpx.AsyncClient(timeout=self.config.health_timeout_s)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)

    def gpu_capacity(self) -> tuple[int, int]:
        """``GpuInventory``: (total, free) GPUs of the allocator."""
        return self.gpus.total, self.gpus.free

    # --- Runtime protocol -----------------------------------------------------------------
    async def start(
        self,
        deployment: str,
        spec: RevisionSpec,
        *,
        pool: str | None = None,
        instance: str | None = None,
        serves: str = "",
    ) -> ReplicaStatus:
        self._adopt()
        gpus = self.gpus.allocate(spec.gpus_per_replica)
        try:  # a port that cannot be had (EMFILE), or one that cannot be listed: not kept
            self._seq += 1
            replica_id = f"{deployment}-{spec.revision}-{os.getpid()}-{self._seq}"
            used = {r.port for r in self._replicas.values()}
            port = free_port(self.config.host)
            while port in used:
                port = free_port(self.config.host)
            replica = _Replica(replica_id, deployment, spec, port, gpus, pool, instance)
            replica.serves = serves
            replica.status(self.config.host)  # every listing would fail on one that cannot
        except BaseException:
            self.gpus.release(gpus)  # or every retry took more, until none were left
            raise
        self._replicas[replica_id] = replica
        replica.task = asyncio.create_task(self._run(replica), name=f"replica-{replica_id}")
        self._save()  # the router sees it starting at once (requests wait for it)
        return replica.status(self.config.host)

    async def adopt(self, replica_id: str, deployment: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is None or replica.deployment == deployment:
            return
        replica.deployment, replica.serves = deployment, ""
        self._save()
        self._changed()

    async def stop(self, replica_id: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        if replica.task is not None and replica.task is not asyncio.current_task():
            replica.task.cancel()
            try:
                await replica.task
            except asyncio.CancelledError:
                pass
            except Exception:  # its failure was logged; it must not keep the replica for good
                log.exception("replica %s supervision had failed", replica_id)
        await self._terminate(replica)
        self._replicas.pop(replica_id, None)
        self.gpus.release(replica.gpus)
        self._save()
        self._changed()

    async def drain(self, replica_id: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is None or replica.state == "draining":
            return
        if replica.state != "ready":
            await self.stop(replica_id)
            return
        if replica.task is not None:
            replica.task.cancel()
        self._set(replica, "draining")
        replica.task = asyncio.create_task(self._drain(replica), name=f"drain-{replica_id}")

    async def list_replicas(self) -> list[ReplicaStatus]:
        self._adopt()
        return self._statuses()

    def pid(self, replica_id: str) -> int | None:
        """The replica's server process (None if it is gone or not launched yet)."""
        replica = self._replicas.get(replica_id)
        return replica.pid if replica is not None else None

    def state(self, replica_id: str) -> ReplicaState | None:
        """The replica's state now, or None once it is gone (stopped, drained away)."""
        replica = self._replicas.get(replica_id)
        return replica.state if replica is not None else None

    def _statuses(self) -> list[ReplicaStatus]:
        return [r.status(self.config.host) for r in self._replicas.values()]

    # --- lifecycle ------------------------------------------------------------------------
    async def _run(self, replica: _Replica) -> None:
        try:
            if replica.pid is None:
                await asyncio.sleep(self._backoff(replica.deployment))
                await self._launch(replica)
                self._save()
            if replica.state != "ready":  # one taken over as ready is watched at once
                await self._wait_ready(replica)
            await self._watch(replica)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an agent must never crash on a replica
            log.exception("replica %s supervision failed", replica.replica_id)
            await self._fail(replica, f"supervision error: {exc!r}")

    def backoff_s(self, deployment: str) -> float:
        """How long a new replica of ``deployment`` would wait before its launch now: 0
        after no failure (or a healthy period), then 1, 2, 4 … ``backoff_max_s``."""
        return self._backoff(deployment)

    def _backoff(self, deployment: str) -> float:
        failures = self._failures.get(deployment, 0)
        if failures == 0:
            return 0.0
        return min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (failures - 1))

    async def _launch(self, replica: _Replica) -> None:
        cache_dir = self.state_dir / "cache"
        argv, env = self.template.render(
            {
                "host": self.config.host,
                "port": str(replica.port),
                "model_id": replica.spec.model_id,
                "deployment": replica.serves or replica.deployment,  # the name it answers
                "revision": replica.spec.revision,
                "replica_id": replica.replica_id,
                "cache_dir": str(cache_dir),
            },
            replica.spec.engine_args,
        )
        full_env = {**_engine_environ(), **env, **self.gpus.env(replica.gpus)}
        _prune_logs(self.state_dir / "logs")
        logfile = open(self.state_dir / "logs" / f"{replica.replica_id}.log", "ab")  # noqa: SIM115
        try:
            replica.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logfile,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            logfile.close()
        replica.pid = replica.proc.pid
        replica.identity = process_identity(replica.pid)
        log.info(
            "replica %s launched (pid %s, port %s)", replica.replica_id, replica.pid, replica.port
        )

    def _exited(self, replica: _Replica) -> str | None:
        if replica.proc is not None:
            code = replica.proc.returncode
            return None if code is None else f"process exited with code {code}"
        if replica.pid is not None:
            try:
                os.kill(replica.pid, 0)
            except ProcessLookupError:
                return "process is gone"
            except PermissionError:
                pass
        return None

    async def _get_ok(self, replica: _Replica, path: str) -> bool:
        try:
            resp = await self._client.get(f"http://{self.config.host}:{replica.port}{path}")
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def _wait_ready(self, replica: _Replica) -> None:
        deadline = self.clock() + self.config.startup_timeout_s
        while True:
            if (why := self._exited(replica)) is not None:
                await self._fail(replica, f"{why} while starting")
                return
            if await self._get_ok(replica, "/health") and await self._get_ok(replica, "/v1/models"):
                replica.ready_at = self.clock()
                self._set(replica, "ready")
                return
            if self.clock() > deadline:
                await self._fail(replica, f"not healthy within {self.config.startup_timeout_s:g}s")
                return
            await asyncio.sleep(0.25)

    async def _watch(self, replica: _Replica) -> None:
        misses = 0
        while replica.state == "ready":
            await asyncio.sleep(self.config.health_interval_s)
            if (why := self._exited(replica)) is not None:
                await self._fail(replica, f"{why} (vLLM exits 0 when its engine dies)")
                return
            if await self._get_ok(replica, "/health"):
                misses = 0
                if (
                    replica.ready_at is not None
                    and self.clock() - replica.ready_at > self.config.stable_after_s
                ):
                    self._failures[replica.deployment] = 0
                continue
            misses += 1
            if misses >= self.config.unhealthy_after:
                await self._fail(replica, f"/health failed {misses} times in a row")
                return

    async def _fail(self, replica: _Replica, reason: str) -> None:
        log.warning("replica %s failed: %s", replica.replica_id, reason)
        replica.reason = reason
        self._failures[replica.deployment] = self._failures.get(replica.deployment, 0) + 1
        await self._terminate(replica, grace=1.0)
        self._set(replica, "failed")

    async def _drain(self, replica: _Replica) -> None:
        deadline = self.clock() + self.config.drain_timeout_s
        # None (the router's count is not known now) waits as a busy replica does
        while self._requests_on(replica.replica_id) != 0 and self.clock() < deadline:
            await asyncio.sleep(0.1)
        await self.stop(replica.replica_id)

    async def _terminate(self, replica: _Replica, grace: float | None = None) -> None:
        """SIGTERM the replica's process group, SIGKILL it after the grace period."""
        if replica.pid is None:
            return
        grace = self.config.stop_grace_s if grace is None else grace
        _signal_group(replica.pid, signal.SIGTERM)
        deadline = self.clock() + grace
        while self._exited(replica) is None and self.clock() < deadline:
            if replica.proc is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(replica.proc.wait(), 0.1)
            else:
                await asyncio.sleep(0.1)
        _signal_group(replica.pid, signal.SIGKILL)  # the engine's children too
        if replica.proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(replica.proc.wait(), 5)

    def _set(self, replica: _Replica, state: ReplicaState) -> None:
        replica.state = state
        self._save()
        self._changed()

    def _changed(self) -> None:
        if self._watcher is not None:
            self._watcher.replicas_changed(self._statuses())

    def _requests_on(self, replica_id: str) -> int | None:
        return self._in_flight.replica_in_flight(replica_id) if self._in_flight is not None else 0

    # --- persistence / adoption -------------------------------------------------------------
    @property
    def _record(self) -> Path:
        return self.state_dir / "replicas.json"

    def _save(self) -> None:
        """Record every replica but failed ones; one not launched yet (backing off) has no
        pid: adoption skips it, the router counts it as starting."""
        rows = [
            {
                "replica_id": r.replica_id,
                "deployment": r.deployment,
                "serves": r.serves,
                "spec": r.spec.model_dump(),
                "port": r.port,
                "gpus": r.gpus,
                "pid": r.pid,
                "identity": r.identity,
                "state": r.state,
                "endpoint": r.status(self.config.host).endpoint,
                "started_at": r.started_at.isoformat(),
                "pool": r.pool,
                "instance": r.instance,
            }
            for r in self._replicas.values()
            if r.state != "failed"
        ]
        tmp = self._record.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(rows))
            tmp.replace(self._record)
        except OSError as exc:  # a full or read-only disk: supervision goes on in memory
            if not self._save_failed:
                log.error(
                    "cannot record the replicas in %s (%s): the router and a restarted "
                    "agent see the last record until it can be written again",
                    self._record,
                    exc,
                )
            self._save_failed = True
            return
        if self._save_failed:
            log.info("replicas recorded in %s again", self._record)
            self._save_failed = False

    def _adopt(self) -> None:
        """Take over replicas a previous agent process started and that still run."""
        if self._adopted:
            return
        self._adopted = True
        if not self._record.exists():
            return
        try:
            rows = json.loads(self._record.read_text())
        except ValueError:
            return
        for row in rows if isinstance(rows, list) else []:
            try:
                self._adopt_one(row)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:  # the others still
                what = row.get("replica_id") if isinstance(row, dict) else None
                log.error("cannot take over recorded replica %r: %s", what, exc)

    def _adopt_one(self, row: dict[str, Any]) -> None:
        pid = row.get("pid")
        if not pid or not _alive(pid) or row["replica_id"] in self._replicas:
            return
        recorded = row.get("identity")
        if recorded is not None and process_identity(pid) != recorded:
            log.warning(
                "replica %s: pid %s is another process now (a reboot or a new pid "
                "namespace): not taken over, never signalled",
                row["replica_id"],
                pid,
            )
            return
        replica = _Replica(
            row["replica_id"],
            row["deployment"],
            RevisionSpec.model_validate(row["spec"]),
            row["port"],
            row["gpus"],
            row.get("pool"),
            row.get("instance"),
            serves=str(row.get("serves") or ""),
            pid=pid,
            identity=recorded,
            started_at=datetime.fromisoformat(row["started_at"]),
            # a replica recorded ready stays routable while it is checked again: the
            # router (its own process) must not stop sending to it because an agent
            # restarted
            state="ready" if row.get("state") == "ready" else "starting",
        )
        replica.status(self.config.host)  # one that cannot be listed is not taken over
        self.gpus.take(replica.gpus)
        self._replicas[replica.replica_id] = replica
        replica.task = asyncio.create_task(self._run(replica), name=f"replica-{replica.replica_id}")
        log.info("adopted replica %s (pid %s)", replica.replica_id, pid)

    async def close(self, *, stop_replicas: bool = True) -> None:
        """Stop supervising (and, by default, stop every replica)."""
        for replica in list(self._replicas.values()):
            if stop_replicas:
                await self.stop(replica.replica_id)
            elif replica.task is not None:
                replica.task.cancel()
        await self._client.aclose()


def _engine_environ() -> dict[str, str]:
    """The agent's environment as an engine gets it: without gpufleet's own settings (the
    NATS and database credentials among them: an engine runs model code) nor any
    secret (``contracts.secret_env``: passwords, cloud keys); its log format and level stay).
    ``HF_TOKEN`` and the like stay too: engines load models with them."""
    return {
        k: v
        for k, v in os.environ.items()
        if (not k.startswith("GPUFLEET_") or k.startswith("GPUFLEET_LOG_")) and not secret_env(k)
    }


def read_replicas(runtime_dir: Path) -> list[ReplicaStatus]:
    """The replicas a ProcessRuntime in ``runtime_dir`` records, as statuses: what the plane's
    router (a process of its own) routes to. Empty if there is no record yet; a record being
    replaced is never seen half-written (it is renamed into place)."""
    try:
        rows = json.loads((Path(runtime_dir) / "replicas.json").read_text())
    except (FileNotFoundError, ValueError):
        return []
    out = []
    for row in rows:
        state = row.get("state", "ready")  # records from before states were kept
        if state not in ("starting", "ready", "draining"):
            continue
        endpoint = row.get("endpoint") or f"http://127.0.0.1:{row['port']}"
        out.append(
            ReplicaStatus(
                replica_id=row["replica_id"],
                deployment=row["deployment"],
                revision=row["spec"]["revision"],
                state=state,
                endpoint=endpoint,
                started_at=datetime.fromisoformat(row["started_at"]),
                pool=row.get("pool"),
                instance=row.get("instance"),
            )
        )
    return out


MAX_ENGINE_LOGS = 64
"""Engine log files kept in ``STATE_DIR/logs`` (the newest): a crash loop made one a try."""


def _prune_logs(logs: Path) -> None:
    try:
        files = sorted(logs.glob("*.log"), key=lambda p: p.stat().st_mtime)
        for old in files[: max(len(files) - MAX_ENGINE_LOGS + 1, 0)]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot prune engine logs in %s: %s", logs, exc)


def process_identity(pid: int) -> str | None:
    """``pid``'s boot id and start time (Linux: /proc), or None where they cannot be read:
    together they name one process, where a pid names whatever has it now."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command may hold spaces and parentheses
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
