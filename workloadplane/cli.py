"""The workload plane's commands: ``agent``, ``router`` and ``engine-sim``.

A Typer app of its own, registered into the ``gpufleet`` command by ``gpufleet_cli`` (the
control plane never imports the workload plane). ``agent`` is the plane's composition
root: the router's view (``RemoteRouter`` for the plane's router in its own process, or an
in-process ``Router``), replica-change relay, runtime and agent are built here and handed to
each other through their constructors; ``router --state-dir`` is the plane's router process. Heavy imports stay inside the commands so that
``gpufleet --help`` is fast.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpufleet_logging import configure_logging

if TYPE_CHECKING:
    from controlplane.contracts import NatsCredentials
    from workloadplane.router.core import Router
    from workloadplane.router.keys import KeyGrant
    from workloadplane.runtime.base import ClosableRuntime, GpuInventory, ReplicaWatcher

app = typer.Typer(
    help="Workload-plane processes: agent, router, engine simulator.",
    pretty_exceptions_enable=False,
)


MAX_BODY = 1024**3


def _name(value: str | None) -> str | None:
    """A cluster or gateway name: one NATS token, DNS-label shaped."""
    from controlplane.contracts import check_cluster_name

    try:
        return value if value is None else check_cluster_name(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _region(value: str) -> str:
    """A region name, as the control plane's regions are named."""
    from controlplane.contracts import CLUSTER_NAME_RE

    if not CLUSTER_NAME_RE.fullmatch(value):
        raise typer.BadParameter(
            f"invalid region name {value!r}: a region of the fleet, e.g. aws-us-east-1"
        )
    return value


def _seconds(
    low: float, high: float, *, low_ok: bool = False
) -> Callable[[float | None], float | None]:
    """A duration option within (low, high] seconds ([low, high] with ``low_ok``)."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not ((low <= value if low_ok else low < value) and value <= high):  # NaN fails
            above = "at least" if low_ok else "above"
            raise typer.BadParameter(f"give seconds {above} {low:g} and at most {high:g}")
        return value

    return check


def _endpoint(url: str) -> str:
    """``http://HOST:PORT`` (a path after it is allowed); else what to write instead. Plain
    HTTP only (the router and the agent speak nothing else to a replica or a router: TLS
    ends in front of them), a host name or IPv4 address, no user:password (never echoed)."""
    scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    shown = repr(url) if "@" not in netloc else "the URL"
    host, _, port = netloc.rpartition(":")
    from controlplane.contracts import whole_number

    number = whole_number(port, 5)
    if scheme == "https":
        raise typer.BadParameter(f"{shown}: write http:// (TLS is not spoken here)")
    if "@" in netloc:
        raise typer.BadParameter("a URL here takes no user:password; write http://HOST:PORT")
    if "[" in host or "]" in host:
        raise typer.BadParameter(f"{shown}: give a host name or an IPv4 address, not IPv6")
    odd = not host.isascii() or not host.isprintable() or " " in host
    if scheme != "http" or not sep or not host or odd or number is None:
        raise typer.BadParameter(f"{shown} is not a URL like http://127.0.0.1:8001")
    if not 1 <= number <= 65535:
        raise typer.BadParameter(f"{shown}: a port is 1 to 65535")
    return url


def _router_url(url: str | None) -> str | None:
    return url if url is None else _endpoint(url)


def _replicas(items: list[str]) -> list[str]:
    """Each --replica is DEPLOYMENT=URL."""
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"{item!r}: write DEPLOYMENT=http://HOST:PORT")
        _endpoint(url)
    return items


class RuntimeKind(enum.StrEnum):
    memory = "memory"
    process = "process"


class EngineKind(enum.StrEnum):
    vllm = "vllm"
    enginesim = "enginesim"


@app.command()
def agent(
    cluster: str = typer.Option(..., help="The cluster this agent runs.", callback=_name),
    nats_url: str = typer.Option(
        "nats://127.0.0.1:4223",
        envvar="GPUFLEET_NATS_URL",
        help="NATS server(s); the default is where `gpufleet up` runs it.",
    ),
    credentials_file: str | None = typer.Option(
        None,
        envvar="GPUFLEET_NATS_CREDENTIALS",
        help='JSON {"user", "password"} (else GPUFLEET_NATS_USER/PASSWORD).',
    ),
    state_dir: str | None = typer.Option(
        None, envvar="GPUFLEET_AGENT_STATE_DIR", help="[.gpufleet/agent-CLUSTER]"
    ),
    runtime: RuntimeKind = typer.Option(RuntimeKind.memory, help="How replicas run."),
    engine: EngineKind = typer.Option(
        EngineKind.vllm, help="What --runtime process runs per replica."
    ),
    engine_python: str | None = typer.Option(
        None, help="Python of the engine's venv (default: the cached vLLM CPU venv)."
    ),
    router_url: str | None = typer.Option(
        None,
        callback=_router_url,
        help="The plane's router, run as its own process (gpufleet router --state-dir), on "
        "loopback: http://127.0.0.1:PORT. Its load drives autoscaling and drains.",
    ),
    router_port: int | None = typer.Option(
        None,
        min=1,
        max=65535,
        help="Serve the plane's router inside this agent's process on this port instead "
        "(development and tests: an agent crash then cuts the data path).",
    ),
    router_host: str = typer.Option("127.0.0.1"),
    heartbeat_interval: float = typer.Option(5.0, callback=_seconds(0.05, 3600)),
    drain_lead: float | None = typer.Option(
        None,
        callback=_seconds(0, 86400, low_ok=True),
        help="Seconds before a draining instance's deadline to drain its replicas even "
        "without a ready replacement [30].",
    ),
    disappearance_grace: float = typer.Option(
        120.0,
        envvar="GPUFLEET_AGENT_DISAPPEARANCE_GRACE_S",
        callback=_seconds(0, 86400, low_ok=True),
        help="Seconds a deployment a newer snapshot dropped keeps serving while it has "
        "traffic here (not when the snapshot retires it: a user deleted it).",
    ),
    metrics_port: int | None = typer.Option(
        None,
        envvar="GPUFLEET_AGENT_METRICS_PORT",
        min=1,
        max=65535,
        help="Serve the agent's own metrics (rejected messages, publish failures) on "
        "127.0.0.1:PORT/metrics; with --router-port the router's /metrics serves them too.",
    ),
    no_fsync: bool = typer.Option(False, "--no-fsync", help="Benchmarks only."),
) -> None:
    """Run a workload-plane agent: gpufleet agent --cluster NAME [--nats-url …]."""
    from workloadplane.agent import ReplicaChanges, load_credentials, run_agent
    from workloadplane.reconcile import DEFAULT_DRAIN_LEAD
    from workloadplane.router.core import Router
    from workloadplane.router.remote import RemoteRouter
    from workloadplane.router.upstream import host_port
    from workloadplane.state import StateDirInUseError, lock_state_dir

    if router_url is not None and router_port is not None:
        raise typer.BadParameter("give --router-url (its own process) or --router-port, not both")
    credentials = _credentials(lambda: load_credentials(cluster, credentials_file))
    configure_logging("agent")
    state = Path(state_dir or f".gpufleet/agent-{cluster}")
    try:
        held = lock_state_dir(state)  # before taking over any replica recorded there
    except StateDirInUseError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    if metrics_port is not None:
        from prometheus_client import start_http_server

        from workloadplane.gpumetrics import register_nvml

        register_nvml()  # the GPUs' utilisation and memory, where NVML is (docs/observability.md)
        start_http_server(metrics_port, addr="127.0.0.1")  # a thread; lives with the process

    async def main() -> None:
        router: Router | None = None
        remote: RemoteRouter | None = None
        if router_url is not None:
            router = remote = RemoteRouter(*host_port(router_url))  # a path is dropped
        elif router_port is not None:
            router = Router()
        router_address = (router_host, router_port) if router_port is not None else None
        changes = ReplicaChanges(router)
        plane_runtime, gpus = _make_runtime(runtime, engine, engine_python, state, changes, router)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        following = asyncio.create_task(remote.follow()) if remote is not None else None
        await run_agent(
            cluster,
            nats_url,
            credentials,
            state,
            plane_runtime,
            heartbeat_interval=heartbeat_interval,
            stop=stop,
            fsync=not no_fsync,
            router=router,
            changes=changes,
            router_address=router_address,
            drain_lead=DEFAULT_DRAIN_LEAD if drain_lead is None else timedelta(seconds=drain_lead),
            disappearance_grace=timedelta(seconds=disappearance_grace),
            gpus=gpus,
        )
        if following is not None and remote is not None:
            following.cancel()
            remote.close()
        await plane_runtime.close(stop_replicas=False)  # a restarted agent adopts them

    # everything built so far lives as long as the process: keep it out of the collector's
    # generations, so collections during serving are short (tail latency of the hot path)
    gc.freeze()
    _run_fast(main())
    held.close()  # the lock: held until the agent is done


def _make_runtime(
    kind: RuntimeKind,
    engine: EngineKind,
    engine_python: str | None,
    state_dir: Path,
    watcher: ReplicaWatcher,
    router: Router | None,
) -> tuple[ClosableRuntime, GpuInventory | None]:
    """The runtime and, when it has real or virtual GPUs to count, its GPU inventory."""
    if kind is RuntimeKind.memory:
        from workloadplane.runtime.memory import InMemoryRuntime

        return InMemoryRuntime(), None
    from workloadplane.runtime.process import ProcessRuntime
    from workloadplane.runtime.templates import enginesim_template, vllm_template

    template = (
        vllm_template(engine_python)
        if engine is EngineKind.vllm
        else enginesim_template(engine_python)
    )
    plane = ProcessRuntime(template, state_dir / "runtime", watcher=watcher, in_flight=router)
    return plane, plane


def _run_fast(main_coro: Coroutine[Any, Any, None]) -> None:
    """uvloop when installed (it is locked): faster scheduling and socket I/O on the path from
    a desired-state change to its acknowledgement, and for the router in this process."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_coro)
    else:
        uvloop.run(main_coro)


@app.command()
def router(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(
        8100, min=1, max=65535, help="Where it serves (8100: the first of `up`'s routers)."
    ),
    state_dir: str | None = typer.Option(
        None,
        help="The plane's agent state directory (its --state-dir): serve its replicas and "
        "deployments, whether the agent runs or not.",
    ),
    replica: list[str] = typer.Option(
        [],
        callback=_replicas,
        help="deployment=url (repeat for each replica): fixed replicas instead.",
    ),
    concurrency: int = typer.Option(
        256, min=1, max=100_000, help="Per-replica limit (fixed replicas)."
    ),
    queue_max_wait: float = typer.Option(
        120.0, callback=_seconds(0, 86400), help="Seconds a request may wait."
    ),
    max_body_bytes: int = typer.Option(
        16 * 1024 * 1024,
        envvar="GPUFLEET_ROUTER_MAX_BODY_BYTES",
        min=1024,
        max=MAX_BODY,
        help="Largest request body; larger ones get 413 [16 MiB].",
    ),
    cluster: str | None = typer.Option(
        None,
        callback=_name,
        help="Publish this plane's load for the gateways on NATS "
        "(gpufleet.v1.cluster.NAME.load, every --load-interval seconds).",
    ),
    nats_url: str = typer.Option(
        "nats://127.0.0.1:4223",
        envvar="GPUFLEET_NATS_URL",
        help="NATS server(s); the default is where `gpufleet up` runs it.",
    ),
    credentials_file: str | None = typer.Option(
        None,
        envvar="GPUFLEET_NATS_CREDENTIALS",
        help="The cluster's NATS credentials (the agent's file).",
    ),
    load_interval: float = typer.Option(
        0.5, callback=_seconds(0.01, 60), help="Seconds between load reports."
    ),
    api_keys_file: str | None = typer.Option(
        None,
        envvar="GPUFLEET_ROUTER_API_KEYS",
        help='JSON {"<key or sha256:HEX>": {"tier": 0-2}}: the keys this plane serves (a '
        "gateway's --plane-api-key among them); none: no authentication.",
    ),
) -> None:
    """Run the plane's router: gpufleet router --state-dir DIR --port P (the plane's data
    path, its own process), or on fixed replicas with --replica (benchmarks, demos)."""
    from workloadplane.router.core import RouterConfig
    from workloadplane.router.server import LoadReports, run_plane, run_static

    keys = _api_keys(api_keys_file)
    reports = None
    if cluster is not None:
        from workloadplane.agent import load_credentials

        creds = _credentials(lambda: load_credentials(cluster, credentials_file))
        reports = LoadReports(cluster, nats_url, creds, interval_s=load_interval)
    configure_logging("router")
    config = RouterConfig(
        queue_max_wait_s=queue_max_wait,
        max_body_bytes=max_body_bytes,
        api_keys={digest: grant.tier for digest, grant in keys.items()},
    )
    if state_dir is not None:
        if replica:
            raise typer.BadParameter("give --state-dir or --replica, not both")
        run_plane(host, port, Path(state_dir), config, reports)
    else:
        run_static(host, port, replica, concurrency, config, reports)


def _credentials(read: Callable[[], NatsCredentials | None]) -> NatsCredentials | None:
    """The NATS credentials ``read`` gives; a bad file exits 2 naming what to change."""
    from workloadplane.natsconnect import CredentialsFileError

    try:
        return read()
    except CredentialsFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--credentials-file") from None


def _api_keys(path: str | None) -> dict[str, KeyGrant]:
    """The keys file's grants by digest ({} without a file); a bad file exits 2 naming
    what to change."""
    from workloadplane.router.keys import KeysFileError, load_keys

    if not path:
        return {}
    try:
        return load_keys(Path(path))
    except KeysFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--api-keys-file") from None


@app.command()
def gateway(
    name: str = typer.Option(
        ..., callback=_name, help="This gateway's name (its NATS user is gateway-NAME)."
    ),
    region: str = typer.Option(
        ...,
        callback=_region,
        help="The region it runs in (the client's, when no x-gpufleet-client-region).",
    ),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8300, min=1, max=65535),
    state_dir: str | None = typer.Option(
        None, envvar="GPUFLEET_GATEWAY_STATE_DIR", help="[.gpufleet/gateway-NAME]"
    ),
    nats_url: str = typer.Option(
        "nats://127.0.0.1:4223",
        envvar="GPUFLEET_NATS_URL",
        help="NATS server(s); the default is where `gpufleet up` runs it.",
    ),
    credentials_file: str | None = typer.Option(
        None,
        envvar="GPUFLEET_NATS_CREDENTIALS",
        help='The gateway\'s read-only NATS credentials, JSON {"user", "password"}.',
    ),
    api_keys_file: str | None = typer.Option(
        None,
        envvar="GPUFLEET_GATEWAY_API_KEYS",
        help='JSON {"<key or sha256:HEX>": {"tier": 0-2, "jurisdictions": ["DE"]}}; '
        "none: no authentication.",
    ),
    plane_api_key: str | None = typer.Option(
        None, envvar="GPUFLEET_GATEWAY_PLANE_KEY", help="Bearer token for the planes' routers."
    ),
    max_body_bytes: int = typer.Option(
        16 * 1024 * 1024, min=1024, max=MAX_BODY, help="Largest request body [16 MiB]."
    ),
    zones_only: bool = typer.Option(
        False,
        "--zones-only",
        help="Network latency from the time-zone model only, not the RTT measured to each "
        "plane (every plane on one machine: make up, tests).",
    ),
) -> None:
    """Run a global gateway: gpufleet gateway --name NAME --region REGION [--port P]."""
    from controlplane.contracts import gateway_inbox_prefix, gateway_user
    from workloadplane.gateway.app import GatewayConfig
    from workloadplane.gateway.server import GatewaySettings, run_gateway
    from workloadplane.natsconnect import read_credentials

    keys = _api_keys(api_keys_file)
    configure_logging("gateway")
    creds = None
    if credentials_file:
        creds = _credentials(
            lambda: read_credentials(
                Path(credentials_file), gateway_user(name), gateway_inbox_prefix(name)
            )
        )
    settings = GatewaySettings(
        name=name,
        region=region,
        host=host,
        port=port,
        state_dir=Path(state_dir or f".gpufleet/gateway-{name}"),
        nats_url=nats_url,
        credentials=creds,
        measured_rtt=not zones_only,
    )
    config = GatewayConfig(
        api_keys=keys, plane_api_key=plane_api_key, max_body_bytes=max_body_bytes
    )
    run_gateway(settings, config)


PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command("engine-sim", context_settings=PASSTHROUGH)
def engine_sim(ctx: typer.Context) -> None:
    """Run the engine simulator (vLLM's OpenAI API and metrics, no GPU); --help for options."""
    from workloadplane.enginesim.__main__ import main

    main(list(ctx.args))


def agent_main(argv: Sequence[str] | None = None) -> None:
    """``python -m workloadplane.agent …``: the same as ``gpufleet agent …``."""
    _run_command("agent", argv)


def router_main(argv: Sequence[str] | None = None) -> None:
    """``python -m workloadplane.router …``: the same as ``gpufleet router …``."""
    _run_command("router", argv)


def _run_command(name: str, argv: Sequence[str] | None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    typer.main.get_command(app).main([name, *args], prog_name="gpufleet")


@app.command()
def loadtest(
    deployment: str = typer.Argument(..., help="The deployment (its model name) to load."),
    url: str = typer.Option(
        "http://127.0.0.1:8110",
        envvar="GPUFLEET_LOADTEST_URL",
        help="An OpenAI-compatible endpoint: a global gateway (default: `up`'s first) or a "
        "plane's router.",
    ),
    profile: str = typer.Option("steady", help="steady | diurnal | burst | abnormal"),
    rate: float = typer.Option(
        5.0, help="Requests a second (the peak of diurnal, the base of burst)."
    ),
    duration: float = typer.Option(30.0, help="Seconds of load."),
    max_tokens: int = typer.Option(64, help="max_tokens of each request."),
    stream_share: float = typer.Option(0.5, help="The share of requests that stream."),
    api_key: str | None = typer.Option(
        None, envvar="GPUFLEET_API_KEY", help="Bearer key, when the endpoint asks for one."
    ),
    timeout: float = typer.Option(60.0, help="Seconds one request may take."),
    html: Path | None = typer.Option(None, help="Write the report with its charts here (HTML)."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write every request's outcome and the summary here (JSON)."
    ),
    allow_remote: bool = typer.Option(
        False, help="Allow an endpoint that is not a loopback or private address."
    ),
) -> None:
    """Drive synthetic OpenAI traffic at a deployment and report TTFT, latency, tokens/s and
    errors by code (docs/loadtest.md). Exits 1 when a normal request failed or an abnormal
    one got a 5xx."""
    import json

    from workloadplane.loadtest import report as rep
    from workloadplane.loadtest.profiles import PROFILES, LoadTestError, Plan
    from workloadplane.loadtest.runner import Progress, run, target

    try:
        if profile not in PROFILES:
            raise LoadTestError(f"--profile must be one of {', '.join(PROFILES)}")
        plan = Plan(profile, deployment, rate, duration, max_tokens, stream_share)  # type: ignore[arg-type]
        plan.check()
        host, port = target(url, allow_remote)
    except LoadTestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    headers = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else []
    live = sys.stderr.isatty()

    def show(p: Progress) -> None:
        done = min(1.0, p.elapsed_s / p.duration_s)
        bar = "#" * int(done * 30)
        line = (
            f"[{bar:<30}] {min(p.elapsed_s, p.duration_s):5.1f}/{p.duration_s:g} s  "
            f"sent {p.sent:,}  answered {p.done:,}  failed {p.failed:,}  in flight {p.in_flight}"
        )
        sys.stderr.write(("\r" + line) if live else (line + "\n"))
        sys.stderr.flush()

    title = f"gpufleet loadtest {deployment}: {profile}, {rate:g}/s for {duration:g} s at {url}"
    every = 0.5 if live else 5.0
    outcomes = asyncio.run(
        run(plan, host, port, headers=headers, timeout_s=timeout, on_progress=show, every_s=every)
    )
    if live:
        sys.stderr.write("\n")
    summary = rep.summarise(outcomes, duration)
    typer.echo(rep.render_text(summary, title))
    if html is not None:
        html.write_text(rep.render_html(summary, rep.per_second(outcomes, duration), title))
        typer.echo(f"report with charts: {html}")
    if json_out is not None:
        asked = {"deployment": deployment, "url": url, "profile": profile, "rate": rate}
        asked |= {"duration_s": duration, "max_tokens": max_tokens, "stream_share": stream_share}
        document = {
            "plan": asked,
            "summary": dict(summary.__dict__) | {"passed": summary.passed},
            "outcomes": [o.as_dict() for o in outcomes],
        }
        json_out.write_text(json.dumps(document, default=str, indent=1))
        typer.echo(f"every request: {json_out}")
    raise typer.Exit(0 if summary.passed else 1)
