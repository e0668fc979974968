"""The provider finds the control plane as the CLI does: the same precedence over the provider
block (the CLI's flags), GPUFLEET_URL/GPUFLEET_TOKEN and the login file. The provider's lookup
is a copy (its venv lacks the control plane's dependencies); this holds them together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.cli.config import load_context, save_context
from tests.integration.terraform.conftest import provider_module


def _provider_lookup() -> Any:
    return provider_module("connection")


CASES = [  # (block url, block token, env url, env token, file url, file token)
    (None, None, None, None, None, None),
    (None, None, None, None, "http://file:1", "gpf_file"),
    (None, None, "http://env:2", "gpf_env", "http://file:1", "gpf_file"),
    (None, None, "http://env:2", None, "http://file:1", "gpf_file"),
    ("http://block:3/", "gpf_block", "http://env:2", "gpf_env", "http://file:1", "gpf_file"),
    (None, "gpf_block", None, None, "http://file:1/", None),
]


@pytest.mark.parametrize("case", CASES)
def test_provider_and_cli_agree(
    case: tuple[str | None, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block_url, block_token, env_url, env_token, file_url, file_token = case
    login = tmp_path / "config.yaml"
    if file_url:
        save_context(file_url, file_token or "", login)
    env = {"GPUFLEET_CONFIG": str(login)}
    env |= {"GPUFLEET_URL": env_url} if env_url else {}
    env |= {"GPUFLEET_TOKEN": env_token} if env_token else {}
    for name in ("GPUFLEET_URL", "GPUFLEET_TOKEN", "GPUFLEET_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    cli = load_context(block_url, block_token)
    provider = _provider_lookup().resolve(block_url, block_token, env)
    assert (provider.url, provider.token) == (cli.url, cli.token or None)


def test_an_unreadable_login_file_says_how_to_fix_it(tmp_path: Path) -> None:
    login = tmp_path / "config.yaml"
    login.write_text("- not\n- a mapping\n")
    lookup = _provider_lookup()
    with pytest.raises(lookup.ConnectionError_, match="run `gpufleet login` again"):
        lookup.resolve(None, None, {"GPUFLEET_CONFIG": str(login)})


def test_only_the_apis_own_not_found_reads_as_deleted() -> None:
    """A 404 from a wrong URL (`/api/v1` given twice, a proxy's page) read as "deleted": the
    plan dropped every object from the state, with the secrets shown once."""
    client = provider_module("client")
    missing = b'{"title": "Not found", "detail": "Pool \'x\' does not exist; list them ..."}'
    assert client.problem_of(404, "Not Found", missing).gone
    no_route = b'{"title": "Not found", "detail": "no route /api/v1/api/v1/pools/x; ..."}'
    assert not client.problem_of(404, "Not Found", no_route).gone
    assert not client.problem_of(404, "Not Found", b"<html>404</html>").gone
    assert not client.problem_of(409, "Conflict", missing).gone


def test_a_redirect_is_an_error_naming_where_not_followed() -> None:
    """urllib followed it: a POST became a GET of the list (a KeyError traceback after), and
    the token went to wherever the redirect pointed."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Moved(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.command)
            self.send_response(301)
            self.send_header("Location", "https://elsewhere.example/api/v1/pools")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST  # noqa: N815 - the handler name http.server looks up

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client_module = provider_module("client")
        connection = provider_module("connection").Connection(
            f"http://127.0.0.1:{server.server_address[1]}", "gpf_x"
        )
        client = client_module.Client(connection)
        with pytest.raises(client_module.ApiProblem, match="redirect to https://elsewhere"):
            client.request("POST", "/pools", {"name": "p"})
        assert seen == ["POST"]  # not followed
    finally:
        server.shutdown()
        server.server_close()
