"""The workload plane's commands: ``agent``, ``router`` and ``engine-sim``.

A Typer app of its own, registered into the ``gpufleet`` command by ``gpufleet_cli`` (the
control plane never imports the workload plane). ``agent`` is the plane's composition
root: router, replica-change relay, runtime and agent are built here and handed to each
other through their constructors. Heavy imports stay inside the commands so that
``gpufleet --help`` is fast.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from workloadplane.router.core import Router
    from workloadplane.runtime.base import ClosableRuntime, GpuInventory, ReplicaWatcher

app = typer.Typer(
    help="Workload-plane processes: agent, router, engine simulator.",
    pretty_exceptions_enable=False,
)


class RuntimeKind(enum.StrEnum):
    memory = "memory"
    process = "process"


class EngineKind(enum.StrEnum):
    vllm = "vllm"
    enginesim = "enginesim"


@app.command()
def agent(
    cluster: str = typer.Option(..., help="The cluster this agent runs."),
    nats_url: str = typer.Option(
        "nats://127.0.0.1:4222", envvar="GPUFLEET_NATS_URL", help="NATS server(s)."
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
    router_port: int | None = typer.Option(
        None, help="Serve the plane's OpenAI-compatible router on this port."
    ),
    router_host: str = typer.Option("127.0.0.1"),
    heartbeat_interval: float = typer.Option(5.0),
    drain_lead: float | None = typer.Option(
        None,
        help="Seconds before a draining instance's deadline to drain its replicas even "
        "without a ready replacement [30].",
    ),
    no_fsync: bool = typer.Option(False, "--no-fsync", help="Benchmarks only."),
) -> None:
    """Run a workload-plane agent: gpufleet agent --cluster NAME [--nats-url …]."""
    from workloadplane.agent import ReplicaChanges, load_credentials, run_agent
    from workloadplane.reconcile import DEFAULT_DRAIN_LEAD
    from workloadplane.router.core import Router

    logging.basicConfig(level=os.environ.get("GPUFLEET_LOG_LEVEL", "INFO"))
    state = Path(state_dir or f".gpufleet/agent-{cluster}")
    router = Router() if router_port is not None else None
    router_address = (router_host, router_port) if router_port is not None else None
    credentials = load_credentials(cluster, credentials_file)

    async def main() -> None:
        changes = ReplicaChanges(router)
        plane_runtime, gpus = _make_runtime(runtime, engine, engine_python, state, changes, router)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
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
            gpus=gpus,
        )
        await plane_runtime.close(stop_replicas=False)  # a restarted agent adopts them

    # everything built so far lives as long as the process: keep it out of the collector's
    # generations, so collections during serving are short (tail latency of the hot path)
    gc.freeze()
    _run_fast(main())


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
    port: int = typer.Option(8080),
    replica: list[str] = typer.Option([], help="deployment=url (repeat for each replica)."),
    concurrency: int = typer.Option(256, help="Per-replica limit."),
    queue_max_wait: float = typer.Option(120.0, help="Seconds a request may wait."),
) -> None:
    """Run the plane's router standalone on fixed replicas (benchmarks, demos)."""
    from workloadplane.router.server import run_static

    run_static(host, port, replica, concurrency, queue_max_wait)


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
