"""Bad input to the dashboard gets a clear 4xx, never a 500; writes need the CSRF value and
the role (in-process app on the real PostgreSQL, no browser)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from controlplane.dashboard.session import COOKIE, csrf_for

pytestmark = pytest.mark.integration


def signed_in(client: TestClient, token: str) -> TestClient:
    answer = client.post("/login", data={"token": token}, follow_redirects=False)
    assert answer.status_code == 303 and COOKIE in answer.cookies
    return client


def csrf_of(client: TestClient) -> str:
    """The CSRF value of the client's session (what its pages carry)."""
    return csrf_for(client.cookies[COOKIE])


def test_pages_without_a_session_send_you_to_login_and_keep_where_you_were(app_client, tokens):
    answer = app_client.get("/pools?page=2", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login?next=/pools%3Fpage%3D2"
    several = app_client.get("/events?log=audit&since=2026-01-01T00:00:00Z", follow_redirects=False)
    login = app_client.get(several.headers["location"])  # every parameter comes back
    assert 'value="/events?log=audit&amp;since=2026-01-01T00:00:00Z"' in login.text
    assert app_client.get("/live/feed", follow_redirects=False).status_code == 303
    bad = app_client.post("/login", data={"token": "gpf_nope"}, follow_redirects=False)
    assert bad.status_code == 401 and "not valid" in bad.text
    assert COOKIE not in bad.cookies


def test_odd_queries_and_unknown_objects_are_4xx(app_client, tokens):
    client = signed_in(app_client, tokens["admin"])
    assert client.get("/pools?page=abc").status_code == 200
    assert client.get("/pools?page=99999999999").status_code == 200
    assert client.get("/events?log=nope").status_code == 400
    assert client.get("/events?cursor=%%%").status_code == 400
    assert client.get("/events?log=events&type=x&bogus=1").status_code == 200
    assert client.get("/deployments/nope").status_code == 404
    assert client.get("/vendor/nope.js").status_code == 404


def test_writes_need_the_csrf_value_the_role_and_sane_fields(app_client, tokens):
    client = signed_in(app_client, tokens["viewer"])
    csrf = csrf_of(client)
    form = {"csrf": csrf, "generation": "1", "min_replicas": "1", "max_replicas": "2"}
    assert client.post("/deployments/x/autoscaling", data=form).status_code == 403
    assert client.post("/tokens", data={"csrf": csrf, "name": "a"}).status_code == 403
    client = signed_in(app_client, tokens["admin"])
    csrf = csrf_of(client)
    assert client.post("/tokens", data={"name": "a", "role": "viewer"}).status_code == 403
    assert client.post("/tokens", data={"csrf": csrf_for("other"), "name": "a"}).status_code == 403
    assert client.post("/tokens", data={"csrf": "é", "name": "a"}).status_code == 403  # was 500
    odd = {b"X-CSRF-Token": "é".encode()}  # non-ASCII bytes: Starlette reads them as latin-1
    assert client.post("/playground/stream", content=b"{}", headers=odd).status_code == 403
    bad_name = client.post("/tokens", data={"csrf": csrf, "name": "Not A Name", "role": "x"})
    assert bad_name.status_code == 400
    bad_number = dict(form, csrf=csrf, max_replicas="lots")
    assert client.post("/deployments/x/autoscaling", data=bad_number).status_code == 400
    assert client.post("/deployments/x/autoscaling", data=dict(form, csrf=csrf)).status_code == 404
    foreign = client.post(
        "/tokens", data={"csrf": csrf, "name": "a"}, headers={"Origin": "https://evil.example"}
    )
    assert foreign.status_code == 403
    headers = {"X-CSRF-Token": csrf}
    assert client.post("/playground/stream", content=b"{", headers=headers).status_code == 400
    deep = b"[" * 100_000 + b"]" * 100_000
    assert client.post("/playground/stream", content=deep, headers=headers).status_code == 400
    far = client.post("/playground/stream", json={"cluster": "nowhere"}, headers=headers)
    assert far.status_code == 400 and "no router or gateway known" in far.text
    verb = client.post("/tokens/admin-token/explode", data={"csrf": csrf})
    assert verb.status_code == 400


def test_the_last_admin_token_cannot_be_disabled_from_the_page(app_client, tokens):
    client = signed_in(app_client, tokens["admin"])
    answer = client.post("/tokens/admin-token/disable", data={"csrf": csrf_of(client)})
    assert answer.status_code == 409, answer.text
    assert client.get("/tokens").status_code == 200  # still signed in


def test_events_filter_by_time_and_a_bad_time_says_how_to_write_one(app_client, tokens):
    client = signed_in(app_client, tokens["admin"])
    made = app_client.post(
        "/api/v1/tokens",
        json={"name": "timed", "role": "viewer"},
        headers={"Authorization": f"Bearer {tokens['admin']}"},
    )
    assert made.status_code == 201
    audit = client.get("/events?log=audit&resource_name=timed")
    assert "timed" in audit.text
    assert "timed" not in client.get("/events?log=audit&until=2000-01-01T00:00:00Z").text
    assert "timed" in client.get("/events?log=audit&since=2000-01-01T00:00:00").text
    bad = client.get("/events?log=events&since=yesterday")
    assert bad.status_code == 400 and "ISO 8601" in bad.text


def test_a_gateway_or_router_that_does_not_answer_is_shown_down_never_a_500(
    database_url, session_factory, tokens
):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with _viewer_of_planes_at(closed, database_url, session_factory, tokens) as client:
        world = client.get("/map")
        assert world.status_code == 200
        assert 'class="gateway bad" data-gateway="use1"' in world.text
        assert "use1 (down)" in world.text
        listed = client.get("/deployments")
        assert listed.status_code == 200
        # the playground names what was picked, never its URL (a gateway's may hold a secret)
        headers = {"X-CSRF-Token": csrf_of(client)}
        asked = {"cluster": "gateway:use1", "model": "m", "prompt": "hi"}
        down = client.post("/playground/stream", json=asked, headers=headers)
        assert down.status_code == 400 and "'gateway:use1' did not answer" in down.text
        assert closed not in down.text


def test_a_form_with_too_many_fields_is_a_400_also_before_login(app_client, tokens):
    """60 fields to /login: a 500 with a traceback in the log, no token needed."""
    answer = app_client.post(
        "/login",
        content="a&" * 60,
        headers={"content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert answer.status_code == 400, answer.text
    assert "at most" in answer.text and "fields" in answer.text


def test_records_pages_follow_their_cursor(app_client, tokens, session_factory):
    """The "Older →" link of the events page: the API's cursor, a 500 until it was fixed."""
    from controlplane.db import models as m

    with session_factory() as s, s.begin():
        for i in range(60):
            s.add(m.Event(type="ClusterDown", object_kind="Cluster", object_name=f"c{i}",
                          message="x"))  # fmt: skip
    client = signed_in(app_client, tokens["admin"])
    first = client.get("/events")
    assert first.status_code == 200
    older = re.search(r'href="(/events\?[^"]*cursor=[^"]+)"', first.text)
    assert older, "no link to older events"
    assert client.get(older[1].replace("&amp;", "&")).status_code == 200


def test_a_router_or_gateway_answering_something_else_is_shown_down_never_a_500(
    database_url, session_factory, tokens
):
    """A web page on the port a router's /metrics was expected on (a wrong port, a proxy's
    error page): the parser raised, and /map and /deployments were 500s for every user."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Html(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = b"<html><body>It works! {not metrics</body></html>\n"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    other = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with _viewer_of_planes_at(other, database_url, session_factory, tokens) as client:
            assert client.get("/map").status_code == 200
            assert client.get("/deployments").status_code == 200
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _viewer_of_planes_at(url: str, database_url, session_factory, tokens) -> Iterator[TestClient]:
    """The dashboard, signed in as a viewer, with gateway use1 and router use1-a at ``url``."""
    from controlplane.api.app import create_app
    from controlplane.settings import Settings
    from tests.integration.api.builders import seed
    from tests.integration.conftest import Api

    settings = Settings(
        database_url=database_url,
        gateway_urls={"use1": {"url": url, "region": "aws-us-east-1"}},  # type: ignore[arg-type]
        router_urls={"use1-a": url},
    )
    app = create_app(settings, session_factory=session_factory)
    with TestClient(app, raise_server_exceptions=False) as client:
        seed(Api(client, tokens["admin"]))
        signed_in(client, tokens["viewer"])
        yield client


def test_behind_a_tls_proxy_login_and_writes_are_from_the_own_origin(app_client, tokens):
    """The browser's Origin is https://host while the app sees http (the proxy ends TLS):
    login and every write were refused as from another origin."""
    proxied = {"Origin": "https://testserver", "X-Forwarded-Proto": "https"}
    answer = app_client.post(
        "/login", data={"token": tokens["admin"]}, headers=proxied, follow_redirects=False
    )
    assert answer.status_code == 303 and COOKIE in answer.cookies
    assert "secure" in answer.headers["set-cookie"].lower()
    # the browser sends that Secure cookie over https; the test client speaks http
    app_client.cookies.set(COOKIE, answer.cookies[COOKIE])
    made = app_client.post(
        "/tokens",
        data={"csrf": csrf_for(answer.cookies[COOKIE]), "name": "ci-bot", "role": "viewer"},
        headers=proxied,
        follow_redirects=False,
    )
    assert made.status_code == 200, made.text
    assert made.headers["cache-control"] == "no-store"  # the one-time secret is never cached
    assert "default-src" in made.headers["content-security-policy"]
    forged = app_client.post(  # the header names no other host: another origin still is one
        "/tokens",
        data={"csrf": csrf_for(answer.cookies[COOKIE]), "name": "xy", "role": "viewer"},
        headers={"Origin": "https://evil.example", "X-Forwarded-Proto": "https"},
        follow_redirects=False,
    )
    assert forged.status_code == 403


def test_the_api_docs_page_does_not_keep_a_token_in_the_browser(app_client):
    page = app_client.get("/api/v1/docs")
    assert page.status_code == 200
    assert '"persistAuthorization": false' in page.text


def test_the_event_feed_ends_once_its_token_is_deleted(app_client, tokens, admin):
    """The feed checked the session once, at connect: a deleted token went on receiving
    events (and, for an admin, audit entries) for the stream's 55 s."""
    watcher = admin.post("tokens", {"name": "watcher", "role": "viewer"}).json()["token"]
    client = signed_in(app_client, watcher)
    client.app.state.feed_every_s = 0.05  # type: ignore[attr-defined]
    with client.stream("GET", "/live/feed") as feed:
        assert feed.status_code == 200
        lines = feed.iter_lines()
        assert next(lines).startswith("retry:")
        assert admin.delete("tokens/watcher").status_code == 204
        client.app.state.verifier._cache.clear()  # type: ignore[attr-defined]  # past its 5 s
        started = time.monotonic()
        for _ in lines:  # ends: the server closed the stream
            pass
    assert time.monotonic() - started < 10
