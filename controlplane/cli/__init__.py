"""The control plane's half of the `gpufleet` command: fleet commands over the REST API,
plus `up` and `bus`. `gpufleet_cli` adds the workload plane's (`agent`, `router`,
`engine-sim`) without this package importing the workload plane.

Each sub-module registers its commands on `app`; heavy imports stay inside the commands so
that `gpufleet --help` is fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Multi-cloud GPU capacity for LLM inference: manage the fleet, run it locally.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


from controlplane.cli import cost, processes, resources, rollout, shadow  # noqa: E402,F401  (register commands)
