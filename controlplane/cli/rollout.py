"""`gpufleet rollout status|pause|resume|promote|rollback DEPLOYMENT`: a deployment's rollout
over `/api/v1/deployments/{ref}/rollout` (docs/rollouts.md)."""

from __future__ import annotations

import typer

from controlplane.cli import app, render
from controlplane.cli.client import ApiError, Client, segment
from controlplane.cli.config import load_context
from controlplane.cli.manifests import CliError
from controlplane.cli.resources import reported

rollout_app = typer.Typer(
    help="A deployment's canary or blue-green rollout: its state, and the operator's commands.",
    no_args_is_help=True,
)
app.add_typer(rollout_app, name="rollout")

DEPLOYMENT = typer.Argument(..., help="The deployment's name.")


def _path(deployment: str) -> str:
    return f"/deployments/{segment(deployment)}/rollout"


@rollout_app.command()
def status(deployment: str = DEPLOYMENT) -> None:
    """The current (or last) rollout: phase, step, share, the gates' last windows."""
    with reported(), Client(load_context()) as client:
        try:
            rollout = client.get(_path(deployment), f"deployment '{deployment}'")
        except ApiError as exc:
            if exc.status != 404 or "no rollout" not in exc.message:
                raise
            raise CliError(
                f"deployment '{deployment}' has had no rollout (one starts when its revision "
                "changes under rollout.strategy: canary or blue_green)"
            ) from exc
    typer.echo(render.rollout_lines(rollout), nl=False)


def _command(verb: str, deployment: str) -> None:
    with reported(), Client(load_context()) as client:
        rollout = client.json_of(
            client.request("POST", f"{_path(deployment)}/{verb}", f"deployment '{deployment}'")
        )
    typer.echo(render.rollout_lines(rollout), nl=False)


@rollout_app.command()
def pause(deployment: str = DEPLOYMENT) -> None:
    """Keep traffic where it is and stop the gates' decisions."""
    _command("pause", deployment)


@rollout_app.command()
def resume(deployment: str = DEPLOYMENT) -> None:
    """Go on from where it paused (a hold starts again)."""
    _command("resume", deployment)


@rollout_app.command()
def promote(deployment: str = DEPLOYMENT) -> None:
    """Send all traffic to the new revision now; the stable one drains."""
    _command("promote", deployment)


@rollout_app.command()
def rollback(deployment: str = DEPLOYMENT) -> None:
    """Send all traffic back to the stable revision; the deployment's spec returns to it."""
    _command("rollback", deployment)
