"""`gpufleet shadow report DEPLOYMENT`: a deployment's shadow revision beside its live one
over `/api/v1/deployments/{ref}/shadow` (docs/rollouts.md#shadow-traffic)."""

from __future__ import annotations

import typer

from controlplane.cli import app
from controlplane.cli.client import ApiError, Client, segment
from controlplane.cli.config import load_context
from controlplane.cli.manifests import CliError
from controlplane.cli.render import shadow_lines
from controlplane.cli.resources import reported

shadow_app = typer.Typer(
    help="A deployment's shadow revision: live vs shadow side by side.", no_args_is_help=True
)
app.add_typer(shadow_app, name="shadow")

DEPLOYMENT = typer.Argument(..., help="The deployment's name.")


@shadow_app.command()
def report(deployment: str = DEPLOYMENT) -> None:
    """Live vs shadow since the shadow was last set or changed: requests, errors, p50/p99
    time to first token and end to end, copies dropped."""
    with reported(), Client(load_context()) as client:
        try:
            body = client.get(
                f"/deployments/{segment(deployment)}/shadow", f"deployment '{deployment}'"
            )
        except ApiError as exc:
            if exc.status != 404 or "no shadow" not in exc.message:
                raise
            raise CliError(
                f"deployment '{deployment}' has no shadow; give it one with a `shadow: "
                "{share: 0.1}` block in its spec and `gpufleet apply`"
            ) from exc
    typer.echo(shadow_lines(body), nl=False)
