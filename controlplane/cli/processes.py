"""Control-plane commands that run processes: `up` (the whole local fleet) and `bus`.

The workload plane's processes (`agent`, `router`, `engine-sim`) are in `workloadplane/cli.py`;
`gpufleet_cli` registers both into the `gpufleet` command.
"""

from __future__ import annotations

from pathlib import Path

import typer

from controlplane.cli import app


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
