"""The ``gpufleet`` command: where each plane's commands are registered.

The control plane's commands (``controlplane.cli``: fleet resources over the REST API,
``up``, ``bus``) and the workload plane's (``workloadplane.cli``: ``agent``, ``router``,
``engine-sim``) are two Typer apps; this package, above both planes, merges them, so that
neither plane imports the other. ``python -m gpufleet_cli …`` is ``gpufleet …``.
"""

from __future__ import annotations

import typer

from controlplane.cli import app as controlplane_app
from workloadplane.cli import app as workloadplane_app

app = typer.Typer(
    name="gpufleet",
    help="Multi-cloud GPU capacity for LLM inference: manage the fleet, run it locally.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(controlplane_app)
app.add_typer(workloadplane_app)

__all__ = ["app"]
