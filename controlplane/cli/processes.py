"""Commands that run processes: `up` (the whole local fleet) and each process's entry."""

from __future__ import annotations

from pathlib import Path

import typer

from controlplane.cli import app

PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command()
def up(
    data_dir: Path = typer.Option(None, help="Where the local fleet keeps its state [.gpufleet]."),
    api_port: int = typer.Option(None, help="API port [8080]."),
) -> None:
    """Start the whole local fleet (PostgreSQL, NATS, Redis, API, Celery, agents) and watch it."""
    from controlplane.local.up import run_up

    raise typer.Exit(run_up(data_dir=data_dir, api_port=api_port))


@app.command()
def bus() -> None:
    """Run the control plane's NATS side: report consumer and desired-state publisher."""
    from controlplane.bus_process import main

    raise typer.Exit(main())


@app.command(context_settings=PASSTHROUGH)
def agent(ctx: typer.Context) -> None:
    """Run a workload-plane agent: gpufleet agent --cluster NAME [--nats-url …] (--help for all)."""
    from workloadplane.cli import agent_main

    agent_main(list(ctx.args))


@app.command("engine-sim", context_settings=PASSTHROUGH)
def engine_sim(ctx: typer.Context) -> None:
    """Run the engine simulator (vLLM's OpenAI API and metrics, no GPU); --help for options."""
    from workloadplane.enginesim.__main__ import main

    raise typer.Exit(main(list(ctx.args)) or 0)
