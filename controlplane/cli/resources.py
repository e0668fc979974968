"""Fleet commands over the REST API (login, context, apply, diff, get, describe, delete).

Every failure prints one line `error: …` on stderr and exits non-zero: 1 when the control plane
refused or could not be reached, 2 for bad input (YAML, an unknown kind). `diff` exits 0 for no
difference, 1 for a difference, 2 for an error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from controlplane.cli import app, render
from controlplane.cli.client import ApiError, Client, segment
from controlplane.cli.config import config_path, load_context, save_context, token_prefix
from controlplane.cli.manifests import (
    Action,
    Change,
    CliError,
    Kind,
    Manifest,
    has_changes,
    load_manifests,
    plan_one,
    resolve_kind,
)
from controlplane.contracts import strip_userinfo

FILE_HELP = "Manifest file (YAML, one or many documents); '-' reads stdin."


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name_ = "name"  # `name` would shadow Enum.name


@contextmanager
def reported(min_exit: int = 1) -> Iterator[None]:
    """Turn a CliError into `error: …` on stderr and an exit code of at least `min_exit`."""
    try:
        yield
    except CliError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(max(exc.exit_code, min_exit)) from None


def _client() -> Client:
    return Client(load_context())


MAX_MANIFEST_BYTES = 16 << 20
"""The largest manifest file read (the API takes 1 MiB a request; 10,000 objects fit)."""


def _read(file: str) -> list[Manifest]:
    name = "<stdin>" if file == "-" else file
    try:
        if file == "-":
            if sys.stdin is None:
                raise CliError("stdin is closed: give the manifest as a file (-f FILE)", 2)
            raw = sys.stdin.buffer.read(MAX_MANIFEST_BYTES + 1)
        else:
            with Path(file).open("rb") as fh:
                raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read {file}: {exc.strerror or exc}", exit_code=2) from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CliError(
            f"{name} is over {MAX_MANIFEST_BYTES >> 20} MiB: not a manifest; split it", 2
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(
            f"{name}: not UTF-8 text (byte {exc.start}); save it as UTF-8 YAML", exit_code=2
        ) from None
    return load_manifests(text, name)


def _plan(client: Client, manifests: list[Manifest]) -> list[Change]:
    return [plan_one(m, client.find(m.kind.path, m.name)) for m in manifests]


def _print_plan(changes: list[Change]) -> None:
    out = render.console()
    for line in render.plan_lines(changes):
        out.print(line)


def _not_found(kind: Kind, name: str) -> CliError:
    return CliError(f"{kind.path} '{name}' not found; list them with `gpufleet get {kind.path}`")


# login / context ---------------------------------------------------------------------------


@app.command()
def login(
    url: str = typer.Option(..., "--url", help="The control plane, e.g. http://127.0.0.1:8080"),
    token: str = typer.Option(
        ..., "--token", prompt=True, hide_input=True, help="An API token (gpf_…)."
    ),
) -> None:
    """Check URL and token against the API, then store them in the user config file (0600)."""
    with reported():
        from controlplane.cli.config import Context

        context = Context(url.rstrip("/"), token, "--url, --token")
        with Client(context) as client:
            try:
                client.get("/gpu-types", params={"limit": 1})
            except ApiError as exc:
                raise CliError(f"login failed: {exc.message}") from exc
        path = save_context(url, token)
        typer.echo(
            f"logged in to {strip_userinfo(context.url)} as {token_prefix(token)}; saved to {path}"
        )


@app.command()
def context() -> None:
    """Show which control plane the CLI talks to (URL, token prefix, where they come from)."""
    with reported():
        ctx = load_context()
        typer.echo(f"url:    {strip_userinfo(ctx.url)}")
        typer.echo(f"token:  {ctx.token_prefix}")
        typer.echo(f"from:   {ctx.source}")
        typer.echo(f"config: {config_path()}")


# apply / diff ------------------------------------------------------------------------------


@app.command()
def apply(
    file: str = typer.Option(..., "-f", "--filename", help=FILE_HELP),
    yes: bool = typer.Option(False, "-y", "--yes", help="Apply without asking."),
) -> None:
    """Create or update the objects in FILE: print the plan, ask, then PUT in dependency order.

    Re-applying the same file changes nothing (every object shows as unchanged).
    """
    with reported():
        manifests = _read(file)
        with _client() as client:
            changes = _plan(client, manifests)
            _print_plan(changes)
            if not has_changes(changes):
                typer.echo("nothing to apply: the control plane already matches")
                return
            typer.echo(render.summary(changes))
            _confirm(yes, stdin_used=file == "-")
            todo = [c for c in changes if c.action != Action.unchanged]
            for done, change in enumerate(todo):
                try:
                    _put(client, change)
                except CliError as exc:
                    exc.message += (
                        f" ({done} of {len(todo)} changes applied; fix it and apply again)"
                    )
                    raise


def _confirm(yes: bool, stdin_used: bool) -> None:
    if yes:
        return
    if stdin_used:
        raise CliError("the manifest came from stdin, so there is no one to ask; pass --yes")
    if sys.stdin is None or not sys.stdin.isatty():
        raise CliError(
            "refusing to apply without confirmation: stdin is not a terminal; "
            "pass --yes to apply anyway"
        )
    if not typer.confirm("Apply these changes?", default=False):
        raise CliError("not applied")


def _put(client: Client, change: Change) -> None:
    m = change.manifest
    result = client.put(m.kind.path, m.name, m.body, change.generation)
    verb = "created" if change.action == Action.create else "updated"
    typer.echo(f"{m.kind.path}/{m.name} {verb} (generation {result.get('generation')})")
    if result.get("token"):
        typer.echo(f"  token (shown once, store it now): {result['token']}")
    if result.get("nats_credentials"):  # a new cluster's agent logs in with these, and
        # nothing can show them again (re-creating the cluster makes new ones)
        creds = json.dumps(result["nats_credentials"], separators=(",", ":"))
        typer.echo(
            f"  NATS credentials (shown once; save them as the agent's --credentials-file, "
            f"mode 0600): {creds}"
        )


@app.command()
def diff(file: str = typer.Option(..., "-f", "--filename", help=FILE_HELP)) -> None:
    """Show what `apply -f FILE` would change. Exit 0: no difference, 1: difference, 2: error."""
    with reported(min_exit=2):
        manifests = _read(file)
        with _client() as client:
            changes = _plan(client, manifests)
        _print_plan(changes)
        typer.echo(render.summary(changes))
    if has_changes(changes):
        raise typer.Exit(1)


# get / describe / delete -------------------------------------------------------------------


@app.command()
def get(
    kind: str = typer.Argument(..., help="pools, deployments, clusters, events… (or singular)."),
    name: str = typer.Argument(
        None,
        help="One object by name; read-only kinds by id, replicas also by name, instances by "
        "the ID the table shows.",
    ),
    output: Output = typer.Option(Output.table, "-o", "--output", help="Output format."),
    where: list[str] = typer.Option(
        [], "--where", "-w", help="API filter KEY=VALUE, e.g. --where provider=aws-main."
    ),
    limit: int = typer.Option(
        None, "--limit", min=1, help="At most this many, 1 or more (events/audit: 50)."
    ),
) -> None:
    """List objects of a kind, or show one; `-o yaml` prints re-applyable manifests."""
    with reported():
        k = resolve_kind(kind)
        with _client() as client:
            if name:
                found = client.find(k.path, name)
                if found is None:
                    raise _not_found(k, name)
                objects = [found]
            else:
                params = dict(_filter(w) for w in where)
                if limit is None and k.path in ("events", "audit"):
                    limit = 50
                objects = client.list(k.path, params, limit)
            if output in (Output.table, Output.wide):
                view = render.View(datetime.now(UTC), _names(client, k) if objects else {})
                if not objects:
                    typer.echo(f"no {k.path} found", err=True)
                    return
                render.console().print(render.table(k, objects, view, output == Output.wide))
                return
        typer.echo(render.formatted(k, objects, output.value, single=bool(name)), nl=False)


def _filter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise CliError(f"--where '{text}' is not KEY=VALUE", exit_code=2)
    return key, value


def _names(client: Client, kind: Kind) -> dict[str, str]:
    names: dict[str, str] = {}
    for path in render.REFERENCES.get(kind.path, ()):
        names.update({o["id"]: o["name"] for o in client.list(path)})
    return names


@app.command()
def describe(
    kind: str = typer.Argument(..., help="The kind, e.g. deployment."),
    name: str = typer.Argument(..., help="The object's name (or the id/name `get` shows)."),
    events: int = typer.Option(20, "--events", help="How many recent events to show."),
) -> None:
    """Show one object's spec, status and recent events."""
    with reported():
        k = resolve_kind(kind)
        with _client() as client:
            obj = client.find(k.path, name)
            if obj is None:
                raise _not_found(k, name)
            if not k.writable:
                typer.echo(render.as_yaml([obj]), nl=False)
                return
            recent = _events_of(client, k, name, events)
            rollout = _rollout_of(client, name) if k.path == "deployments" else None
            shadow = (
                client.get(f"/deployments/{segment(name)}/shadow", f"deployment '{name}'")
                if k.path == "deployments" and obj.get("shadow")
                else None
            )
        typer.echo(render.describe(k, obj, recent, datetime.now(UTC), rollout, shadow), nl=False)


def _rollout_of(client: Client, deployment: str) -> dict[str, Any] | None:
    """The deployment's current or last rollout; None when it never had one."""
    try:
        return client.get(
            f"/deployments/{segment(deployment)}/rollout", f"deployment '{deployment}'"
        )
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _events_of(client: Client, kind: Kind, name: str, limit: int) -> list[dict[str, Any]]:
    if limit <= 0:
        return []
    accepted = {kind.name.lower(), kind.path, kind.path.rstrip("s"), *kind.aliases}
    found = client.list("events", {"object_name": name}, limit * 2)

    def same_kind(event: dict[str, Any]) -> bool:
        return str(event.get("object_kind", "")).lower().replace("_", "-") in accepted

    return [e for e in found if same_kind(e)][:limit]


@app.command()
def delete(
    kind: str = typer.Argument(None, help="The kind, e.g. pool (omit with -f)."),
    name: str = typer.Argument(None, help="The object's name (omit with -f)."),
    file: str = typer.Option(None, "-f", "--filename", help="Delete every object in this file."),
    force: bool = typer.Option(
        False, "--force", help="Delete even with running replicas (clusters, deployments)."
    ),
) -> None:
    """Delete one object, or every object of a manifest file (in reverse dependency order)."""
    with reported(), _client() as client:
        if file:
            if kind or name:
                raise CliError("give either KIND NAME or -f FILE, not both", exit_code=2)
            for m in reversed(_read(file)):
                _delete_one(client, m.kind, m.name, force, missing_ok=True)
            return
        if not kind or not name:
            raise CliError(
                "give KIND NAME (e.g. `gpufleet delete pool gpu-a`) or -f FILE", exit_code=2
            )
        k = resolve_kind(kind)
        if not k.writable:
            raise CliError(f"{k.path} are read-only: the control plane writes them", 2)
        _delete_one(client, k, name, force, missing_ok=False)


API_FORCE = "?force=true"


def _delete_one(client: Client, kind: Kind, name: str, force: bool, missing_ok: bool) -> None:
    try:
        client.delete(kind.path, name, force)
    except ApiError as exc:
        if exc.status == 409:  # the API's hint names its query parameter; ours is the flag
            exc.message = exc.message.replace(API_FORCE, "--force")
        if exc.status != 404:
            raise
        if not missing_ok:
            raise _not_found(kind, name) from exc
        typer.echo(f"{kind.path}/{name} already gone")
        return
    typer.echo(f"{kind.path}/{name} deleted")
