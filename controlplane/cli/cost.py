"""`gpufleet cost`: what the fleet cost over a window (`GET /api/v1/costs`), as tables, JSON,
or a self-contained HTML page with charts (docs/cost.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

import typer

from controlplane.cli import app, costreport, render
from controlplane.cli.client import Client
from controlplane.cli.config import load_context
from controlplane.cli.manifests import CliError
from controlplane.cli.resources import reported


class By(StrEnum):
    deployment = "deployment"
    cluster = "cluster"
    provider = "provider"
    pool = "pool"
    purchase_type = "purchase-type"


class Format(StrEnum):
    table = "table"
    json = "json"


@app.command()
def cost(
    by: By = typer.Option(By.deployment, "--by", help="Group the cost by this."),
    week: bool = typer.Option(False, "--week", help="The last 7 days (default: the last day)."),
    start: str = typer.Option(None, "--from", help="Window start, ISO 8601 (UTC without offset)."),
    end: str = typer.Option(None, "--to", help="Window end, ISO 8601 (default: now)."),
    html_file: Path = typer.Option(None, "--html", help="Also write an HTML report with charts."),
    output: Format = typer.Option(Format.table, "-o", "--output", help="table or json."),
    limit: int = typer.Option(20, "--limit", min=1, max=500, help="Groups shown; the rest sum."),
) -> None:
    """The fleet's cost: by group, per day, reservations, $/Mtok against API prices, TCO."""
    with reported():
        if week and start:
            raise CliError("give --week or --from, not both", exit_code=2)
        params: dict[str, str | int] = {"group_by": by.value.replace("-", "_"), "limit": limit}
        if end:
            params["to"] = end
        if start:
            params["from"] = start
        else:
            stop = _parse(end) if end else datetime.now(UTC)
            try:
                params["from"] = (stop - timedelta(days=7 if week else 1)).isoformat()
            except OverflowError:  # --to 0001-01-01: a traceback before
                raise CliError(f"--to '{end}' is too early a time", exit_code=2) from None
        with Client(load_context()) as client:
            report = client.get("/costs", "costs", params=params)
        if html_file is not None:
            title = f"gpufleet cost by {by.value}"
            try:
                html_file.write_text(costreport.render_html(report, title))
            except OSError as exc:
                raise CliError(f"cannot write {html_file}: {exc.strerror or exc}") from exc
        if output == Format.json:
            typer.echo(json.dumps(report, indent=2))
        else:
            out = render.console()
            out.print(f"{report['from']} – {report['to']}")
            for title, table in costreport.tables(report):
                out.print(f"\n[bold]{title}[/bold]")
                out.print(table)
        if html_file is not None:
            typer.echo(f"wrote {html_file}", err=True)


def _parse(value: str) -> datetime:
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"--to '{value[:40]}' is not a time; use ISO 8601", exit_code=2) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)
