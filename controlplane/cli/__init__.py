"""The `gpufleet` command: fleet commands over the REST API, plus `up`, `agent`, `engine-sim`.

Each sub-module registers its commands on `app`; heavy imports stay inside the commands so
that `gpufleet --help` is fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpufleet",
    help="Multi-cloud GPU capacity for LLM inference: manage the fleet, run it locally.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """gpufleet: multi-cloud GPU capacity for LLM inference."""


from controlplane.cli import processes, resources  # noqa: E402,F401  (register commands)
