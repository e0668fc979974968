"""The dashboard's writes and live parts: login/logout, the autoscaling edit (If-Match), the
what-if preview, tokens, the live event feed (server-sent events) and the playground's
stream. Every write checks the session's CSRF value and the role (session.check_write)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from controlplane.api.context import actor_of, read_scope, session_scope
from controlplane.api.placement import Preview, engine_changes
from controlplane.contracts import loads
from controlplane.dashboard.session import (
    check_write,
    end_session,
    integer,
    is_own_origin,
    principal_of,
    read_form,
    session_id,
    set_session,
)
from controlplane.dashboard.web import (
    GATEWAY_TARGET,
    TEMPLATES,
    render,
    secure_headers,
    signed_in,
    started,
)
from controlplane.errors import BadRequest, ControlPlaneError, Forbidden, StaleGeneration
from controlplane.services import fleet_view, inventory, records, tokens, what_if
from controlplane.services import placement as placement_svc
from controlplane.services.records import RECORDS
from controlplane.services.resources import KINDS
from controlplane.services.sessions import SessionStore
from controlplane.specs import Role, TokenSpec

RECORD = {k.path: k for k in RECORDS}
FEED_EVERY_S = 1.0
FEED_LIFETIME_S = 55.0
"""A stream ends after this; the browser's EventSource reconnects (so no request outlives a
shutdown by long)."""
PROMPT_MAX = 8000


def _fragment(request: Request, template: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
    response = TEMPLATES.TemplateResponse(request, template, ctx, status_code=status_code)
    secure_headers(response)  # a new token's one-time secret comes in one: never cached
    return response


def _problem(request: Request, error: ControlPlaneError) -> HTMLResponse:
    return _fragment(request, "_problem.html", error.status, error=error)


def _safe_next(target: str | None) -> str:
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def actions_router() -> APIRouter:
    router = APIRouter(include_in_schema=False, dependencies=[Depends(started)])

    @router.get("/login", response_class=HTMLResponse)
    def login_page(request: Request) -> HTMLResponse:
        target = _safe_next(request.query_params.get("next"))
        return render(request, "login.html", None, next=target, error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await read_form(request)
        origin = request.headers.get("origin")
        if origin and not is_own_origin(request, origin):
            raise Forbidden(f"a login from another origin ({origin}) is refused")
        token = form.get("token", "").strip()[:200]
        target = _safe_next(form.get("next"))
        verifier = request.app.state.verifier
        try:
            principal = await run_in_threadpool(verifier.verify, f"Bearer {token}")
        except ControlPlaneError:
            return render(
                request, "login.html", None, status_code=401, next=target,
                error="That token is not valid (unknown, disabled or expired). Paste an API "
                "token (gpf_…): the admin token `gpufleet up` printed, or one an admin made.",
            )  # fmt: skip
        store: SessionStore = request.app.state.dashboard_sessions
        sid = await run_in_threadpool(store.open, principal.token_id, session_id(request))
        if sid is None:  # deleted since the verifier's cache saw it
            return render(
                request, "login.html", None, status_code=401, next=target,
                error="That token was just deleted. Paste another API token.",
            )  # fmt: skip
        response = RedirectResponse(target, status_code=303)
        set_session(response, request, sid)
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        form = await read_form(request)
        check_write(request, principal, Role.viewer, form.get("csrf"))
        store: SessionStore = request.app.state.dashboard_sessions
        await run_in_threadpool(store.close, session_id(request) or "")
        response = RedirectResponse("/login", status_code=303)
        end_session(response)
        return response

    @router.post("/deployments/{name}/autoscaling", response_class=HTMLResponse)
    async def edit_autoscaling(request: Request, name: str) -> HTMLResponse:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        form = await read_form(request)
        try:
            check_write(request, principal, Role.operator, form.get("csrf"))
            changes = {
                "autoscaling": {
                    "min_replicas": integer(form, "min_replicas", 0, 10_000),
                    "max_replicas": integer(form, "max_replicas", 0, 10_000),
                }
            }
            generation = integer(form, "generation", 0, 10**9)

            def write() -> inventory.WriteResult:
                with session_scope(request) as session:
                    return inventory.patch(
                        session, KINDS["deployments"], name, changes,
                        actor_of(request), generation,
                    )  # fmt: skip

            result = await run_in_threadpool(write)
        except StaleGeneration:
            return _fragment(
                request, "_stale.html", 409, name=name, generation=form.get("generation")
            )
        except ControlPlaneError as error:
            return _problem(request, error)
        if result.changed:
            request.app.state.on_inventory_change("Deployment")
        return _fragment(
            request, "_saved.html", name=name, generation=result.row.generation,
            autoscaling=result.row.autoscaling,
        )  # fmt: skip

    @router.post("/placement/preview", response_class=HTMLResponse)
    async def preview(request: Request) -> HTMLResponse:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        form = await read_form(request)
        try:
            check_write(request, principal, Role.viewer, form.get("csrf"))
            body = Preview.model_validate({"changes": [_what_if_change(form)]})

            def run() -> dict[str, Any]:
                with read_scope(request) as session:
                    world = placement_svc.load_world(session)
                    return what_if.preview(world, engine_changes(body, world))

            result = await run_in_threadpool(run)
        except ControlPlaneError as error:
            return _problem(request, error)
        except ValueError as error:  # pydantic's, from model_validate
            return _problem(request, BadRequest(str(error).splitlines()[0]))
        return _fragment(request, "_preview.html", result=result)

    @router.post("/tokens", response_class=HTMLResponse)
    async def create_token(request: Request) -> HTMLResponse:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        form = await read_form(request)
        try:
            check_write(request, principal, Role.admin, form.get("csrf"))
            spec = TokenSpec.model_validate(
                {"name": form.get("name", "").strip(), "role": form.get("role", "viewer")}
            )

            def write() -> str:
                with session_scope(request) as session:
                    done = inventory.create(session, KINDS["tokens"], spec, actor_of(request))
                    return (done.secrets or {})["token"]

            secret = await run_in_threadpool(write)
        except ControlPlaneError as error:
            return _problem(request, error)
        except ValueError as error:
            return _problem(request, BadRequest(f"name or role is not valid: {error}"[:300]))
        return _fragment(request, "_token_created.html", name=spec.name, secret=secret)

    @router.post("/tokens/{name}/{verb}", response_class=HTMLResponse)
    async def change_token(request: Request, name: str, verb: str) -> Response:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        form = await read_form(request)
        try:
            check_write(request, principal, Role.admin, form.get("csrf"))
            if verb not in ("disable", "enable", "delete"):
                raise BadRequest("verb must be disable, enable or delete")

            def write() -> None:
                with session_scope(request) as session:
                    if verb == "delete":
                        inventory.delete(session, KINDS["tokens"], name, actor_of(request))
                    else:
                        tokens.set_disabled(session, name, verb == "disable", actor_of(request))

            await run_in_threadpool(write)
            request.app.state.verifier.forget()
            request.app.state.dashboard_sessions.forget()
        except ControlPlaneError as error:
            return _problem(request, error)
        return Response(status_code=200, headers={"HX-Refresh": "true"})

    @router.get("/live/feed")
    async def feed(request: Request) -> Response:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        logs = ["events", *(["audit"] if principal.role == Role.admin else [])]
        # what is already there is read before the response starts: once the browser sees
        # the stream open, anything that happens after is sent
        seen = {item["id"] for _, item in await run_in_threadpool(_latest, request, logs)}
        return StreamingResponse(
            _feed(request, logs, seen, request.app.state.feed_every_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @router.post("/playground/stream")
    async def playground(request: Request) -> Response:
        principal = await run_in_threadpool(signed_in, request)  # may read the database
        check_write(request, principal, Role.viewer, request.headers.get("x-csrf-token"))
        try:
            asked = loads(await request.body())
        except ValueError:
            raise BadRequest("send a JSON object: cluster, model, prompt, max_tokens") from None
        if not isinstance(asked, dict):
            raise BadRequest("send a JSON object: cluster, model, prompt, max_tokens")
        cluster, model = str(asked.get("cluster", "")), str(asked.get("model", ""))
        prompt = str(asked.get("prompt", ""))[:PROMPT_MAX]
        max_tokens = asked.get("max_tokens", 64)
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= 1024:
            raise BadRequest("max_tokens must be a whole number from 1 to 1024")

        def where() -> str | None:
            if cluster.startswith(GATEWAY_TARGET):
                gateway = settings.gateway_urls.get(cluster.removeprefix(GATEWAY_TARGET))
                return gateway.url.rstrip("/") if gateway is not None else None
            with read_scope(request) as session:
                urls = fleet_view.router_urls(session, settings.router_urls)
                return urls.get(cluster)

        settings = request.app.state.settings
        base = await run_in_threadpool(where)
        if base is None:
            raise BadRequest(f"no router or gateway known as '{cluster}'; pick one from the list")
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        return await _relay(f"{base}/v1/chat/completions", body, cluster)

    return router


def _what_if_change(form: dict[str, str]) -> dict[str, Any]:
    kind, name = form.get("kind", ""), form.get("name", "").strip()
    if kind == "cluster":
        return {"kind": "cluster", "name": name, "state": form.get("state", "down")}
    if kind == "pool":
        return {"kind": "pool", "name": name, "gpus": integer(form, "value", 0, 10**6)}
    if kind == "deployment":
        return {"kind": "deployment", "name": name, "replicas": integer(form, "value", 0, 10**5)}
    raise BadRequest("kind must be cluster, pool or deployment")


def _latest(request: Request, logs: list[str]) -> list[tuple[str, dict[str, Any]]]:
    with read_scope(request) as session:
        return [
            (log, item)
            for log in logs
            for item in records.page(session, RECORD[log], {}, 20, None)["items"]
        ]


async def _feed(
    request: Request, logs: list[str], seen: set[str], every_s: float
) -> AsyncIterator[str]:
    """New events (and audit entries, for admins) as `message` SSE frames of table rows."""
    yield "retry: 2000\n\n"
    ends = time.monotonic() + FEED_LIFETIME_S
    while time.monotonic() < ends and not await request.is_disconnected():
        await asyncio.sleep(every_s)
        if await run_in_threadpool(principal_of, request) is None:
            return  # its token was disabled or deleted: no more rows (the verifier's 5 s)
        fresh = [
            (log, i) for log, i in await run_in_threadpool(_latest, request, logs)
            if i["id"] not in seen
        ]  # fmt: skip
        for log, item in sorted(fresh, key=lambda li: li[1]["time"]):
            seen.add(item["id"])
            row = TEMPLATES.get_template("_feed_row.html").render(log=log, item=item)
            yield "event: message\ndata: " + " ".join(row.split()) + "\n\n"


RELAY_MAX_S = 300.0
"""How long the playground relays one answer in all (each read has its own 60 s)."""


async def _relay(url: str, body: dict[str, Any], target: str) -> Response:
    """Stream the router's answer through unchanged (nothing of it is stored or logged), for
    at most ``RELAY_MAX_S``. An error names ``target`` (the cluster or gateway picked), never
    the URL: a gateway's may carry credentials, and any viewer sees the error."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0))
    try:
        upstream = await client.send(client.build_request("POST", url, json=body), stream=True)
    except httpx.HTTPError as error:
        await client.aclose()
        raise BadRequest(f"'{target}' did not answer ({type(error).__name__})") from None

    async def chunks() -> AsyncIterator[bytes]:
        deadline = time.monotonic() + RELAY_MAX_S
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
                if time.monotonic() > deadline:  # a trickle must not hold the stream for ever
                    break
        finally:
            await upstream.aclose()
            await client.aclose()

    return StreamingResponse(
        chunks(),
        status_code=upstream.status_code,
        media_type=upstream.headers.get("content-type", "text/event-stream"),
        headers={"Cache-Control": "no-store"},
    )
