"""`gpufleet shadow report DEPLOYMENT`: a deployment's shadow revision beside its live one
over `/api/v1/deployments/{ref}/shadow` (docs/rollouts.md#shadow-traffic)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer

from controlplane.cli import app
from controlplane.cli.client import ApiError, Client
from controlplane.cli.config import load_context
from controlplane.cli.manifests import CliError
from controlplane.cli.resources import reported

shadow_app = typer.Typer(
    help="A deployment's shadow revision: live vs shadow side by side.", no_args_is_help=True
)
app.add_typer(shadow_app, name="shadow")

DEPLOYMENT = typer.Argument(..., help="The deployment's name.")
ROWS = (
    ("Requests", "requests", "{}"),
    ("Errors", "errors", "{}"),
    ("Error rate", "error_rate", "{:.1%}"),
    ("p50 TTFT", "p50_ttft_s", "{:.3f}s"),
    ("p99 TTFT", "p99_ttft_s", "{:.3f}s"),
    ("p50 end-to-end", "p50_e2e_s", "{:.3f}s"),
    ("p99 end-to-end", "p99_e2e_s", "{:.3f}s"),
)


@shadow_app.command()
def report(deployment: str = DEPLOYMENT) -> None:
    """Live vs shadow since the shadow was last set or changed: requests, errors, p50/p99
    time to first token and end to end, copies dropped."""
    with reported(), Client(load_context()) as client:
        try:
            body = client.get(f"/deployments/{deployment}/shadow", f"deployment '{deployment}'")
        except ApiError as exc:
            if exc.status != 404 or "no shadow" not in exc.message:
                raise
            raise CliError(
                f"deployment '{deployment}' has no shadow; give it one with a `shadow: "
                "{share: 0.1}` block in its spec and `gpufleet apply`"
            ) from exc
    typer.echo(shadow_lines(body), nl=False)


def shadow_lines(r: Mapping[str, Any]) -> str:
    """The shadow report as a table: a row per figure, live and shadow side by side."""
    spec = r.get("spec") or {}
    changes = ", ".join(
        f"{k}={v}" for k, v in spec.items() if k not in ("share", "replicas")
    )  # the revision fields it changes
    lines = [
        f"Deployment:  {r.get('deployment')} (shadow lane {r.get('lane')})",
        f"Shadow:      {float(spec.get('share') or 0):.0%} of the requests copied, "
        f"{spec.get('replicas')} replica(s) per cluster; changes: {changes or 'none'}",
        f"Clusters:    {', '.join(r.get('clusters') or []) or '- (no report yet)'}",
        "Window:      since the shadow was last set or changed",
        "",
        f"{'':<16}{'live':>12}{'shadow':>12}",
    ]
    live, shadow = r.get("live") or {}, r.get("shadow") or {}
    for label, key, fmt in ROWS:
        lines.append(
            f"{label:<16}{fmt.format(live.get(key, 0)):>12}{fmt.format(shadow.get(key, 0)):>12}"
        )
    lines.append(f"{'Dropped':<16}{'-':>12}{shadow.get('dropped', 0):>12}")
    return "\n".join(lines) + "\n"
