"""`gpufleet up`: the whole local fleet in one process tree, supervised, stopped cleanly.

Servers (PostgreSQL, NATS, Redis) are started unless a URL is configured. Then migrations,
the first admin token, the demo fleet (first start only), and the processes in `PROCESSES`:
adding a component is one entry there. Ctrl-C stops everything in reverse order.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from controlplane.local import prometheus
from controlplane.local.gateways import (
    GATEWAYS,
    DemoGateway,
    gateway_base_port,
    metrics_ports,
)
from controlplane.local.nats import NatsServerError
from controlplane.local.ports import ServerExited, port_is_free, wait_for_port
from controlplane.local.postgres import EmbeddedPostgres, PostgresError
from controlplane.local.redis import RedisError
from controlplane.local.secrets import Secrets, cluster_users
from controlplane.local.supervisor import (
    MAX_BACKOFF_S,
    REPO,
    Child,
    DataDirLock,
    UpError,
    stop_recorded_replicas,
)
from controlplane.settings import Settings, load_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from controlplane.services.fleet_view import ReplicaEndpoint

FLEET = REPO / "infra" / "examples" / "fleet.yaml"
API_PRICES = REPO / "infra" / "examples" / "api-prices.yaml"
PORT_WAIT_S = 180.0
"""How long a started process may take to open its port (while it runs)."""
"""Public API prices to compare the demo deployments with (apart from fleet.yaml, which the
Terraform example mirrors object for object)."""


def processes(
    settings: Settings,
    agents: dict[str, Path],
    gateways: Sequence[tuple[DemoGateway, Path]] = (),
) -> list[Child]:
    """Every long-running process of the local fleet, in start order.

    `agents`: cluster name → its NATS credentials file, for the demo clusters run here;
    `gateways`: the demo gateways with their NATS credentials files.
    """
    py = sys.executable
    data = settings.data_dir.resolve()
    metrics = metrics_ports(settings)
    children = [
        Child(
            "api",
            [
                py,
                "-m",
                "uvicorn",
                "--factory",
                "controlplane.api.main:build_app",
                "--host",
                settings.api_host,
                "--port",
                str(settings.api_port),
                "--no-access-log",
                "--timeout-graceful-shutdown",  # open dashboard event streams end, not hang
                "3",
                "--workers",
                str(settings.api_workers),
            ],
            # every worker writes its metrics here, any worker's /metrics sums them
            env={"PROMETHEUS_MULTIPROC_DIR": str(api_metrics_dir(data))},
            port=settings.api_port,
            after_stop=lambda: reset_dir(api_metrics_dir(data)),
        ),
        Child(
            "worker",
            [
                py,
                "-m",
                "celery",
                "-A",
                "controlplane.tasks:celery_app",
                "worker",
                "--pool=solo",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
            ],
            env={"GPUFLEET_WORKER_METRICS_PORT": str(metrics.worker)} if metrics else {},
        ),
        Child(
            "beat",
            [
                py,
                "-m",
                "celery",
                "-A",
                "controlplane.tasks:celery_app",
                "beat",
                "--loglevel=WARNING",  # not a "Sending due task" line per schedule (2 a second)
                "--schedule",
                str(data / "celerybeat-schedule"),
            ],
        ),
        Child(
            "bus",
            [py, "-m", "controlplane.cli", "bus"],
            env={"GPUFLEET_BUS_METRICS_PORT": str(metrics.bus)} if metrics else {},
        ),
    ]
    for i, (cluster, creds) in enumerate(sorted(agents.items())):
        state = data / "agents" / cluster
        router_port = settings.router_base_port + i
        # the plane's data path is a process of its own: an agent crash costs no request
        router_argv = ["router", "--state-dir", str(state), "--port", str(router_port)]
        # it publishes the plane's load for the gateways, as the cluster's NATS user
        router_argv += ["--cluster", cluster, "--credentials-file", str(creds)]
        children.append(
            Child(
                f"router-{cluster}",
                [py, "-m", "gpufleet_cli", *router_argv],
                port=router_port,
                plane=True,
            )
        )
        children.append(
            Child(
                f"agent-{cluster}",
                [
                    py,
                    "-m",
                    "gpufleet_cli",
                    "agent",
                    "--cluster",
                    cluster,
                    "--credentials-file",
                    str(creds),
                    "--state-dir",
                    str(state),
                    "--runtime",
                    "process",
                    "--engine",
                    "enginesim",
                    "--engine-python",
                    py,
                    "--router-url",
                    f"http://127.0.0.1:{router_port}",
                    *(["--metrics-port", str(metrics.agent(i))] if metrics else []),
                ],
                after_stop=lambda state=state: stop_recorded_replicas(state / "runtime"),
                plane=True,
            )
        )
    for i, (gw, creds) in enumerate(gateways):
        port = gateway_base_port(settings) + i
        argv = ["gateway", "--name", gw.name, "--region", gw.region, "--port", str(port)]
        argv += ["--state-dir", str(data / "gateways" / gw.name), "--credentials-file", str(creds)]
        argv += ["--zones-only"]  # every plane is on this machine: measured RTTs are all ~0
        gateway = Child(
            f"gateway-{gw.name}", [py, "-m", "gpufleet_cli", *argv], port=port, plane=True
        )
        children.append(gateway)
    return children


def api_metrics_dir(data: Path) -> Path:
    """Where the API's worker processes keep their Prometheus figures (multiprocess mode)."""
    return data / "metrics" / "api"


def reset_dir(path: Path) -> None:
    """Empty ``path`` (create it if missing): a restarted API must not add its old figures."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)


def _reachable_by_nobody(path: Path) -> bool:
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.stat().st_mode & 0o001:
            return False
    return True


def postgres_root(data_dir: Path) -> Path:
    """Where PostgreSQL keeps its files. As root it runs as `nobody`, who must reach them."""
    wanted = data_dir / "postgres"
    if os.geteuid() != 0 or _reachable_by_nobody(data_dir.parent):
        return wanted
    import hashlib

    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return Path("/var/tmp") / f"gpufleet-postgres-{digest}"  # noqa: S108 - owned dir, see init


T = TypeVar("T")


def read_database(database_url: str, read: Callable[[Session], T]) -> T:
    """``read`` in a session of its own (one connection, closed after): `up`'s status
    line and scrape targets ask the database now and then, not per request."""
    from controlplane.db.session import make_engine, make_session_factory

    engine = make_engine(database_url, pool_size=1)
    try:
        with make_session_factory(engine)() as session:
            return read(session)
    finally:
        engine.dispose()


def check_ports(wanted: dict[str, int]) -> None:
    busy = [f"{name} port {port}" for name, port in wanted.items() if not port_is_free(port)]
    if busy:
        raise UpError(
            f"{', '.join(busy)} already in use; free it or choose another port "
            "(GPUFLEET_API_PORT, GPUFLEET_POSTGRES_PORT, GPUFLEET_NATS_PORT, GPUFLEET_REDIS_PORT, "
            "GPUFLEET_ROUTER_BASE_PORT: demo cluster i's router listens on base + i, "
            "GPUFLEET_GATEWAY_BASE_PORT: gateway i on base + i, "
            "GPUFLEET_METRICS_BASE_PORT: the bus's, the worker's and the agents' /metrics on "
            "base, base + 1 and base + 10 + i; 0 turns them off)"
        )


def load_fleet(
    database_url: str, fleet: Path, secrets: Secrets, router_base_port: int | None = None
) -> int:
    import yaml

    from controlplane.db.session import make_engine, make_session_factory, transaction
    from controlplane.services.inventory import Actor
    from controlplane.services.manifests import apply_manifests

    docs = [d for d in yaml.safe_load_all(fleet.read_text()) if d]
    if router_base_port is not None:  # each demo cluster's endpoint: its router here
        clusters = sorted(d["name"] for d in docs if d.get("kind") == "Cluster")
        for d in docs:
            if d.get("kind") == "Cluster":
                port = router_base_port + clusters.index(d["name"])
                d.setdefault("endpoint", f"http://127.0.0.1:{port}")
    engine = make_engine(database_url, pool_size=1)
    try:
        with transaction(make_session_factory(engine)) as session:
            results = apply_manifests(session, docs, Actor("system:demo-fleet"))
            for result in results:
                creds = (result.secrets or {}).get("nats_credentials")
                if creds:
                    secrets.save_cluster(result.row.name, creds)
    finally:
        engine.dispose()
    return len(docs)


def bootstrap(database_url: str) -> str | None:
    """Migrate to head and create the first admin token; returns its secret on first start."""
    from sqlalchemy.exc import OperationalError

    from controlplane.db.migrate import upgrade
    from controlplane.db.session import make_engine, make_session_factory, transaction
    from controlplane.services.tokens import ensure_admin_token

    try:
        upgrade(database_url)
        engine = make_engine(database_url, pool_size=1)
        try:
            with transaction(make_session_factory(engine)) as session:
                return ensure_admin_token(session)
        finally:
            engine.dispose()
    except OperationalError as exc:
        raise UpError(
            f"cannot use the database: {str(exc.orig or exc).strip().splitlines()[0]}; check "
            "GPUFLEET_DATABASE_URL, or unset it to use the embedded PostgreSQL"
        ) from exc


class Fleet:
    """Starts, watches and stops everything `up` runs."""

    def __init__(self, settings: Settings, say: Callable[[str], None]) -> None:
        self.settings = settings
        self.say = say
        self.data_dir = settings.data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self.stops: list[Callable[[], None]] = []
        self.children: list[Child] = []
        self.env: dict[str, str] = {}
        self.secrets = Secrets(self.data_dir / "secrets")
        self.servers: list[Child] = []
        self.interrupted = False
        """Ctrl-C (or SIGTERM) came: waits during the start end at once."""
        """Servers `up` started itself (NATS, Redis), supervised like the other children."""
        self.nats: Child | None = None
        self.postgres: EmbeddedPostgres | None = None
        """PostgreSQL, when `up` started it: a daemon (pg_ctl), restarted if it dies."""
        self.postgres_next_start = 0.0
        self.nats_users: dict[str, Any] = {}

    def start_servers(self) -> None:
        s = self.settings
        wanted = {"api": s.api_port}
        wanted |= {
            f"router {i}": s.router_base_port + i for i in range(len(self.secrets.clusters()))
        }
        first_gateway = gateway_base_port(s)
        wanted |= {f"gateway {i}": first_gateway + i for i in range(len(GATEWAYS))}
        metrics = metrics_ports(s)
        if metrics:
            wanted |= {"bus metrics": metrics.bus, "worker metrics": metrics.worker}
            wanted |= {
                f"agent {i} metrics": metrics.agent(i) for i in range(len(self.secrets.clusters()))
            }
        if not s.database_url:
            wanted["postgres"] = s.postgres_port
        if not s.redis_url:
            wanted["redis"] = s.redis_port
        check_ports(wanted)
        if not s.nats_url:
            wanted["nats"] = s.nats_port
        check_ports(wanted)
        database_url = s.database_url or self._start_postgres()
        redis_url = s.redis_url or self._start_redis()
        self.env = {
            **os.environ,
            "GPUFLEET_DATABASE_URL": database_url,
            "GPUFLEET_REDIS_URL": redis_url,
            "GPUFLEET_DATA_DIR": str(self.data_dir),
            "PYTHONUNBUFFERED": "1",
        }

    def start_nats(self) -> None:
        """NATS with the authorization config: the control plane's user and every cluster's."""
        from controlplane.local.nats import NatsServer

        creds = self.secrets.controlplane()
        self.env |= {"GPUFLEET_NATS_USER": creds.user, "GPUFLEET_NATS_PASSWORD": creds.password}
        if self.settings.nats_url:
            self.env["GPUFLEET_NATS_URL"] = self.settings.nats_url
            return
        server = NatsServer(
            store_dir=self.data_dir / "nats",
            port=self.settings.nats_port,
            config_file=self.write_nats_config(),
        )
        self.nats = self._start_server(Child("nats", server.command(), port=server.port))
        self.env["GPUFLEET_NATS_URL"] = server.url

    def write_nats_config(self) -> Path:
        from controlplane.bus.credentials import render_server_config, write_server_config

        users = cluster_users(self.env["GPUFLEET_DATABASE_URL"])
        self.nats_users = users
        text = render_server_config(
            controlplane=self.secrets.controlplane(),
            clusters=users,
            gateways={g.name: self.secrets.gateway(g.name)[1] for g in GATEWAYS},
            store_dir=self.data_dir / "nats",
            port=self.settings.nats_port,
        )
        return write_server_config(self.data_dir / "nats.conf", text)

    def refresh_nats_users(self) -> str | None:
        """A cluster created while `up` runs needs its NATS user: rewrite and reload."""
        if self.nats is None or not self.nats.alive:
            return None
        if cluster_users(self.env["GPUFLEET_DATABASE_URL"]).keys() == self.nats_users.keys():
            return None
        self.write_nats_config()
        assert self.nats.process is not None
        self.nats.process.send_signal(signal.SIGHUP)
        return f"NATS reloaded with {len(self.nats_users)} cluster user(s)"

    def _start_postgres(self) -> str:
        server = EmbeddedPostgres(postgres_root(self.data_dir), self.settings.postgres_port)
        if server.init():
            self.say(f"initialised PostgreSQL in {server.data_dir}")
        server.start()
        self.postgres = server
        self.stops.append(server.stop)
        server.create_database("gpufleet")
        return server.url("gpufleet")

    def _start_redis(self) -> str:
        from controlplane.local.redis import RedisServer

        server = RedisServer(self.data_dir / "redis", self.settings.redis_port)
        self._start_server(Child("redis", server.command(), port=server.port))
        return server.url + "/0"

    def _start_server(self, child: Child) -> Child:
        """Start a server `up` supervises like its other children, and wait for its port."""
        child.start(self.env or dict(os.environ), self.log_dir, time.monotonic())
        self.servers.append(child)
        self._wait_for_port(child)
        return child

    def _wait_for_port(self, child: Child) -> None:
        """Wait for the child's port while it runs: ``up`` starts every process at once, and
        on 2 busy cores one may take a minute or more to import and bind."""
        assert child.port is not None
        log = self.log_dir / (child.name + ".log")
        try:
            wait_for_port(
                child.port, PORT_WAIT_S, alive=lambda: child.alive and not self.interrupted
            )
        except ServerExited as exc:
            if self.interrupted:
                raise UpError("interrupted while starting; stopping what had started") from exc
            raise UpError(
                f"{child.name} exited before it opened port {child.port}; see {log}"
            ) from exc
        except TimeoutError as exc:
            raise UpError(
                f"{child.name} did not open port {child.port} in {PORT_WAIT_S:.0f} s; see {log}"
            ) from exc

    def start_processes(self) -> None:
        gateways = [(g, self.secrets.gateway(g.name)[0]) for g in GATEWAYS]
        self.children = processes(self.settings, self.secrets.clusters(), gateways)
        base = self.settings.router_base_port  # the dashboard's playground finds them here
        urls = {
            c: f"http://127.0.0.1:{base + i}" for i, c in enumerate(sorted(self.secrets.clusters()))
        }
        self.env["GPUFLEET_ROUTER_URLS"] = json.dumps(urls)
        first_gateway = gateway_base_port(self.settings)  # the dashboard's map reads them
        self.env["GPUFLEET_GATEWAY_URLS"] = json.dumps(
            {
                g.name: {"url": f"http://127.0.0.1:{first_gateway + i}", "region": g.region}
                for i, g in enumerate(GATEWAYS)
            }
        )
        reset_dir(api_metrics_dir(self.settings.data_dir.resolve()))
        for child in self.children:
            child.start(self.env, self.log_dir, time.monotonic())
        for child in self.children:
            if child.port is not None:
                self._wait_for_port(child)

    def supervise_once(self, now: float) -> list[str]:
        """Restart children that exited (exponential backoff, reset after a healthy run);
        returns what happened."""
        notes = self._supervise_postgres(now)
        for child in [*self.servers, *self.children]:
            if child.exited:
                notes.append(child.reap(now))
            elif child.process is None and now >= child.next_start:
                child.start(self.env, self.log_dir, now)
                notes.append(f"{child.name} restarted")
        return notes

    def _supervise_postgres(self, now: float) -> list[str]:
        server = self.postgres
        if server is None or server.running or now < self.postgres_next_start:
            return []
        self.postgres_next_start = now + MAX_BACKOFF_S  # pg_ctl start waits for it itself
        try:
            server.start()
        except PostgresError as exc:
            return [f"postgres is not running and did not restart: {exc}"]
        return ["postgres was not running; restarted"]

    def status_line(self) -> str:
        marks = (
            [] if self.postgres is None else [f"postgres{'✓' if self.postgres.running else '✗'}"]
        )
        marks += [f"{c.name}{'✓' if c.alive else '✗'}" for c in [*self.servers, *self.children]]
        return f"[{time.strftime('%H:%M:%S')}] {' '.join(marks)}"

    def stop(self) -> None:
        for child in reversed([*self.servers, *self.children]):
            child.stop()
        for stop in reversed(self.stops):
            with contextlib.suppress(Exception):
                stop()


class Periodic:
    """A job of the supervision loop that may fail while a dependency is down (the database,
    say): a failure is said once and retried next time; never ends `up`."""

    def __init__(self, what: str, job: Callable[[], str | None], every_s: float) -> None:
        self.what = what
        self.job = job
        self.every_s = every_s
        self.last = -math.inf
        self.failing: str | None = None

    def due(self, now: float) -> bool:
        return now - self.last >= self.every_s

    def run(self, now: float) -> str | None:
        self.last = now
        try:
            note = self.job()
        except Exception as exc:  # a dependency down: say it once, keep supervising
            first = self.failing is None
            self.failing = _one_line(exc)
            if not first:
                return None
            return f"{self.what} failed ({self.failing}); retrying every {self.every_s:.0f} s"
        if self.failing is not None:
            self.failing = None
            return f"{self.what} works again" + (f"; {note}" if note else "")
        return note


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def run_up(
    data_dir: Path | None = None,
    api_port: int | None = None,
    say: Callable[[str], None] = print,
) -> int:
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if api_port is not None:
        overrides["api_port"] = api_port
    settings = load_settings(**overrides)
    data = settings.data_dir.resolve()
    (data / "logs").mkdir(parents=True, exist_ok=True)
    run_dir = data / "run"
    run_dir.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(run_dir))
    lock = DataDirLock(data)
    fleet = Fleet(settings, say)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = fleet.interrupted = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        lock.acquire()
        fleet.start_servers()
        token = bootstrap(fleet.env["GPUFLEET_DATABASE_URL"])
        if token:  # kept before anything else can fail
            fleet.secrets.save_admin_token(token)
            _login_cli(f"http://{settings.api_host}:{settings.api_port}", token)
        if token and settings.load_demo_fleet and FLEET.exists():
            count = load_fleet(
                fleet.env["GPUFLEET_DATABASE_URL"], FLEET, fleet.secrets, settings.router_base_port
            )
            if API_PRICES.exists():
                count += load_fleet(fleet.env["GPUFLEET_DATABASE_URL"], API_PRICES, fleet.secrets)
            say(f"loaded the demo fleet: {count} objects from {FLEET.relative_to(REPO)}")
        fleet.start_nats()
        fleet.start_processes()
        routers = RouterModels(settings, fleet.env["GPUFLEET_DATABASE_URL"], fleet.secrets)
        scrape = ScrapeTargets(settings, fleet.env["GPUFLEET_DATABASE_URL"], fleet.secrets)
        scrape.ensure_token()
        scrape.refresh()
        _announce(settings, token, say, data, routers.lines(), fleet.secrets.admin_token_path)
        every = settings.up_status_every_s
        jobs = [
            Periodic("reading which models the routers serve", routers.changes, every),
            Periodic("writing the Prometheus targets", scrape.refresh, every),
            Periodic(
                "refreshing the NATS users from the database", fleet.refresh_nats_users, every
            ),
            Periodic("status", fleet.status_line, every),
        ]
        while not stopping:
            now = time.monotonic()
            notes = fleet.supervise_once(now)
            notes += [job.run(now) for job in jobs if job.due(now)]
            for note in notes:
                if note:
                    say(note)
            time.sleep(0.2)
        say("stopping…")
        return 0
    except (UpError, PostgresError, NatsServerError, RedisError) as exc:
        say(f"error: {exc}")  # what to change, not a traceback
        return 1
    finally:
        fleet.stop()
        lock.release()


def _cli_points_at(url: str) -> bool:
    """Whether the CLI's saved login is this fleet's (with a token)."""
    from controlplane.cli.config import config_path, read_file

    try:
        stored = read_file(config_path())
    except Exception:  # a config the CLI itself will complain about
        return False
    return str(stored.get("url", "")).rstrip("/") == url and bool(stored.get("token"))


def _login_cli(url: str, token: str) -> Path | None:
    """Like `kind`/`minikube`: point the CLI at the new local fleet, unless it already points
    somewhere (never overwrite a user's existing login)."""
    from controlplane.cli.config import config_path, save_context

    path = config_path()
    if path.exists():
        return None
    return save_context(url, token, path)


class RouterModels:
    """Which models (deployment names) each demo cluster's router serves: said at start and
    again whenever placement changes it."""

    def __init__(self, settings: Settings, database_url: str, secrets: Secrets) -> None:
        self.settings, self.database_url = settings, database_url
        self.clusters = sorted(secrets.clusters())
        self.last: dict[str, list[str]] | None = None

    def read(self) -> dict[str, list[str]]:
        from controlplane.services.records import models_by_cluster

        return read_database(self.database_url, models_by_cluster)

    def lines(self, models: dict[str, list[str]] | None = None) -> list[str]:
        if models is None:
            models = self.last = self.read()
        return [
            router_line(cluster, self.settings.router_base_port + i, models.get(cluster, []))
            for i, cluster in enumerate(self.clusters)
        ]

    def changes(self) -> str | None:
        models = self.read()
        if models == self.last:
            return None
        before, self.last = self.last or {}, models
        changed = [
            line
            for cluster, line in zip(self.clusters, self.lines(models), strict=True)
            if models.get(cluster, []) != before.get(cluster, [])
        ]
        return "\n".join(changed) or None


class ScrapeTargets:
    """The fleet's ``/metrics`` endpoints as Prometheus file_sd lists under
    ``<data dir>/prometheus/`` (``controlplane/local/prometheus.py``), refreshed from the
    database: a cluster's router is its ``endpoint`` (the demo clusters: `up`'s routers)."""

    def __init__(self, settings: Settings, database_url: str, secrets: Secrets) -> None:
        self.settings, self.database_url = settings, database_url
        self.clusters = sorted(secrets.clusters())
        self.directory = settings.data_dir.resolve() / "prometheus"

    def ensure_token(self) -> None:
        """A viewer token for Prometheus, made once and kept in ``token`` (0600). Delete the
        file (and the token, `gpufleet delete token prometheus-…`) to get a new one."""
        path = self.directory / prometheus.TOKEN_FILE
        if path.exists():
            return
        from controlplane.db.session import make_engine, make_session_factory, transaction
        from controlplane.services.tokens import create_scrape_token

        engine = make_engine(self.database_url, pool_size=1)
        try:
            with transaction(make_session_factory(engine)) as session:
                secret = create_scrape_token(session)
        finally:
            engine.dispose()
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secret)

    def routers(self) -> dict[str, str]:
        from controlplane.services.fleet_view import router_urls

        base = self.settings.router_base_port
        demo = {c: f"http://127.0.0.1:{base + i}" for i, c in enumerate(self.clusters)}
        return read_database(self.database_url, lambda session: router_urls(session, demo))

    def replicas(self) -> list[ReplicaEndpoint]:
        from controlplane.services.fleet_view import replica_endpoints

        return read_database(self.database_url, replica_endpoints)

    def jobs(
        self, routers: dict[str, str], replicas: Sequence[ReplicaEndpoint] = ()
    ) -> dict[str, list[prometheus.Target]]:
        s = self.settings
        host = "127.0.0.1" if s.api_host in ("0.0.0.0", "::") else s.api_host
        first = gateway_base_port(s)
        jobs: dict[str, list[prometheus.Target]] = {
            "api": [prometheus.Target(f"{host}:{s.api_port}", {})],
            "router": [
                prometheus.Target(prometheus.address_of(url), {"cluster": c})
                for c, url in routers.items()
            ],
            "gateway": [
                prometheus.Target(f"127.0.0.1:{first + i}", {"gateway": g.name, "region": g.region})
                for i, g in enumerate(GATEWAYS)
            ],
            "replica": [
                prometheus.Target(
                    prometheus.address_of(r.url),
                    {"cluster": r.cluster, "deployment": r.deployment, "replica": r.replica},
                )
                for r in replicas
            ],
        }
        metrics = metrics_ports(s)
        if metrics:
            jobs["bus"] = [prometheus.Target(f"127.0.0.1:{metrics.bus}", {})]
            jobs["worker"] = [prometheus.Target(f"127.0.0.1:{metrics.worker}", {})]
            jobs["agent"] = [
                prometheus.Target(f"127.0.0.1:{metrics.agent(i)}", {"cluster": c})
                for i, c in enumerate(self.clusters)
            ]
        return jobs

    def refresh(self) -> str | None:
        changed = prometheus.write(self.directory, self.jobs(self.routers(), self.replicas()))
        return (
            None
            if not changed or changed == list(prometheus.JOBS)
            else ("prometheus targets changed: " + ", ".join(changed))
        )


def gateway_lines(settings: Settings) -> list[str]:
    """The fleet's front doors, said first: one OpenAI endpoint over every plane."""
    first = gateway_base_port(settings)
    return [
        f"  gateway {g.name:<5} ({g.region}) OpenAI-compatible endpoint "
        f"http://127.0.0.1:{first + i}/v1  (every model, nearest plane with headroom)"
        for i, g in enumerate(GATEWAYS)
    ]


def router_line(cluster: str, port: int, models: list[str]) -> str:
    serves = (
        f"serves {', '.join(models)}"
        if models
        else "serves no model yet (placement puts them there; up says when)"
    )
    return f"  cluster {cluster:<9} OpenAI-compatible router http://127.0.0.1:{port}/v1  {serves}"


def _announce(
    settings: Settings,
    token: str | None,
    say: Callable[[str], None],
    data: Path,
    routers: list[str],
    token_file: Path,
) -> None:
    url = f"http://{settings.api_host}:{settings.api_port}"
    say(f"gpufleet is up  (data: {data}, logs: {data / 'logs'})")
    for line in gateway_lines(settings):
        say(line)
    say(f"  dashboard  {url}/   (log in with an API token)")
    say(f"  API        {url}/api/v1   (docs: {url}/api/v1/docs)")
    for line in routers:
        say(line)
    config = data / "prometheus" / "prometheus.yml"
    say(f"  metrics    every process's /metrics: prometheus --config.file={config}")
    kept = f"kept in {token_file}" if token_file.exists() else "not kept on disk"
    if token:
        say(f"  admin token (shown once, keep it): {token}")
        say(f"    ({kept}: delete that file once you have stored the token elsewhere)")
    else:
        say(f"  admin token: created at the first start ({kept})")
    if _cli_points_at(url):
        say("  the gpufleet CLI is logged in: try `.venv/bin/gpufleet get deployments`")
    else:
        say(f"  try: gpufleet login --url {url} --token <token> && gpufleet get deployments")
    say("Ctrl-C stops everything.")
