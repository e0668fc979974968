"""Where the CLI's context comes from, the config file's mode, and what tables show."""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from controlplane.cli.client import problem_line
from controlplane.cli.config import load_context, save_context, token_prefix
from controlplane.cli.manifests import CliError, resolve_kind
from controlplane.cli.render import View, age, formatted, table

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpufleet" / "config.yaml"
    monkeypatch.setenv("GPUFLEET_CONFIG", str(path))
    monkeypatch.delenv("GPUFLEET_URL", raising=False)
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    return path


def test_file_is_private_and_env_overrides_it(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config.parent.mkdir()
    config.write_text("old")
    config.chmod(0o644)
    save_context("http://cp:8080/", "gpf_secretsecret")
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    ctx = load_context()
    assert (ctx.url, ctx.token, ctx.source) == ("http://cp:8080", "gpf_secretsecret", str(config))
    monkeypatch.setenv("GPUFLEET_TOKEN", "gpf_fromenv")
    ctx = load_context()
    assert ctx.token == "gpf_fromenv" and ctx.source == f"{config}, GPUFLEET_TOKEN"
    assert load_context(url="http://flag").url == "http://flag"


def test_defaults_without_file_or_env(config: Path) -> None:
    ctx = load_context()
    assert (ctx.url, ctx.token, ctx.source) == ("http://127.0.0.1:8080", None, "defaults")


def test_token_prefix_never_shows_the_secret() -> None:
    assert token_prefix("gpf_abcdefghijklmnop") == "gpf_abcdef…"
    assert token_prefix("short") == "sho…"
    assert token_prefix(None) == "(none)"


@pytest.mark.parametrize(
    ("when", "shown"),
    [
        ("2026-03-01T11:59:58+00:00", "2s"),
        ("2026-03-01T11:55:00+00:00", "5m"),
        ("2026-02-27T12:00:00", "2d"),
        (None, "-"),
    ],
)
def test_age(when: str | None, shown: str) -> None:
    assert age(when, NOW) == shown


def test_placements_show_names_not_ids() -> None:
    from rich.console import Console

    placement = {
        "id": "p1",
        "deployment_id": "d1",
        "cluster_id": "c1",
        "pool_id": "x1234567890",
        "replicas": 2,
        "min_replicas": 1,
        "max_replicas": 3,
        "cost_per_hour": "7.5",
    }
    view = View(NOW, {"d1": "chat", "c1": "use1-a"})
    console = Console(width=200, record=True)
    console.print(table(resolve_kind("placements"), [placement], view, wide=False))
    row = console.export_text().splitlines()[1].split()
    assert row == ["chat", "use1-a", "x1234567", "2", "1–3", "7.5"]


def test_name_output() -> None:
    assert formatted(resolve_kind("pools"), [{"name": "a"}, {"name": "b"}], "name", False) == (
        "pool/a\npool/b\n"
    )


def test_problem_line_keeps_the_detail_and_drops_the_kind_prefix() -> None:
    body = {
        "type": "t",
        "title": "Invalid specification",
        "status": 422,
        "detail": "invalid Pool: gpus: Input should be greater than or equal to 0",
    }
    response = httpx.Response(422, json=body)
    assert problem_line(response) == "gpus: Input should be greater than or equal to 0"
    assert problem_line(httpx.Response(502, text="bad gateway")) == "HTTP 502 Bad Gateway"


def test_wide_deployments_show_the_failover_and_the_warm_standby() -> None:
    from rich.console import Console

    passive = {
        "name": "chat",
        "failover": {"mode": "active_passive", "standby_cluster": "usw2-a"},
        "status": {"placement": {"standby_replicas": 1}},
    }
    view = View(NOW, {})
    console = Console(width=300, record=True)
    console.print(table(resolve_kind("deployments"), [passive, {"name": "b"}], view, wide=True))
    lines = console.export_text().splitlines()
    assert "FAILOVER" in lines[0]
    assert lines[1].rstrip().endswith("active_passive→usw2-a (1 warm)")
    assert lines[2].rstrip().endswith("active_active")


def test_a_broken_config_file_is_one_line_that_never_shows_the_token(config: Path) -> None:
    """YAML's own message quotes the lines around the problem: the saved token with them."""
    from controlplane.cli.manifests import CliError

    config.parent.mkdir()
    config.write_text("url: http://cp:8080\ntoken: gpf_secretsecret\n  oops: [\n")
    with pytest.raises(CliError) as err:
        load_context()
    assert "\n" not in str(err.value) and "gpf_secretsecret" not in str(err.value)
    assert "at line 3" in str(err.value) and "gpufleet login" in str(err.value)


def test_odd_settings_and_a_server_that_is_not_the_api_are_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controlplane.cli.client import Client
    from controlplane.cli.config import Context
    from controlplane.cli.manifests import CliError

    context = Context("http://127.0.0.1:9", "gpf_token", "test")
    for timeout in ("-1", "nan", "inf", "1e300", "lots"):
        monkeypatch.setenv("GPUFLEET_CLI_TIMEOUT", timeout)
        with pytest.raises(CliError, match="GPUFLEET_CLI_TIMEOUT"):
            Client(context)
    monkeypatch.delenv("GPUFLEET_CLI_TIMEOUT")
    with pytest.raises(CliError, match="not a gpufleet token"):
        Client(Context("http://127.0.0.1:9", "tökén", "test"))
    client = Client(context)
    html = httpx.MockTransport(lambda r: httpx.Response(200, html="<html>proxy</html>"))
    client._http = httpx.Client(base_url="http://127.0.0.1:9/api/v1", transport=html)
    with pytest.raises(CliError, match="not the API's JSON"):
        client.list("pools")
    other = httpx.MockTransport(lambda r: httpx.Response(200, json={"hello": "world"}))
    client._http = httpx.Client(base_url="http://127.0.0.1:9/api/v1", transport=other)
    with pytest.raises(CliError, match="page without items"):
        client.list("pools")


def _answering(handler) -> tuple[object, list[httpx.Request]]:
    """A Client whose requests go to ``handler``, and the requests it got."""
    from controlplane.cli.client import Client
    from controlplane.cli.config import Context

    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    client = Client(Context("http://127.0.0.1:9", "gpf_token", "test"))
    client._http = httpx.Client(
        base_url="http://127.0.0.1:9/api/v1", transport=httpx.MockTransport(record)
    )
    return client, seen


@pytest.mark.parametrize(
    "name", ["old/../../deployments/chat-llm", "chat-llm?force=true", "gpu-a#2", ".."]
)
def test_a_name_is_one_path_segment_and_never_names_another_object(name: str) -> None:
    """A name was put into the URL as it was: `delete pool 'old/../../deployments/chat-llm'`
    deleted the deployment, `chat-llm?force=true` got round --force."""
    client, seen = _answering(lambda r: httpx.Response(204))
    client.delete("pools", name)  # type: ignore[attr-defined]
    [request] = seen
    path = request.url.raw_path.decode()
    assert path.startswith("/api/v1/pools/") and path.count("/") == 4
    assert "?" not in path and "#" not in path and "/deployments" not in path
    assert request.url.params.get("force") is None


def test_a_redirect_is_an_error_saying_nothing_was_done() -> None:
    """A 301 from an ingress was taken for success: "deleted", exit 0, nothing deleted."""
    from controlplane.cli.client import ApiError

    client, _ = _answering(
        lambda r: httpx.Response(308, headers={"location": "https://cp.example/api/v1/pools/a"})
    )
    with pytest.raises(ApiError, match=r"redirect to https://cp\.example.*nothing was done"):
        client.delete("pools", "a")  # type: ignore[attr-defined]


def test_a_refused_token_from_the_environment_says_to_fix_the_environment(monkeypatch) -> None:
    from controlplane.cli.client import ApiError, Client
    from controlplane.cli.config import Context

    for source, says in (("GPUFLEET_TOKEN", "unset it"), ("~/.config", "gpufleet login --url")):
        client = Client(Context("http://127.0.0.1:9", "gpf_old", source))
        client._http = httpx.Client(
            base_url="http://127.0.0.1:9/api/v1",
            transport=httpx.MockTransport(lambda r: httpx.Response(401, json={"detail": "no"})),
        )
        with pytest.raises(ApiError) as refused:
            client.get("/pools")
        assert says in refused.value.message and "--token" not in refused.value.message


def test_a_name_that_is_not_utf8_is_one_line() -> None:
    client, seen = _answering(lambda r: httpx.Response(200, json={}))
    with pytest.raises(CliError, match="not valid UTF-8"):
        client.find("pools", "a\udcff")  # type: ignore[attr-defined]
    assert seen == []


def test_a_bad_proxy_or_certificate_setting_is_one_line(monkeypatch) -> None:
    from controlplane.cli.client import Client
    from controlplane.cli.config import Context

    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")
    with pytest.raises(CliError, match="SSL_CERT_FILE"):
        Client(Context("https://127.0.0.1:9", "gpf_token", "test"))


@pytest.mark.parametrize(
    "url",
    [
        "http://admin:hun/ter2@127.0.0.1:9",
        "http://admin:p?ss#w@127.0.0.1:9/api",
        "nats://u:a@b@127.0.0.1:4222,nats://u:x/y@127.0.0.2:4222",
    ],
)
def test_userinfo_is_never_shown_whatever_the_password_holds(url: str) -> None:
    from controlplane.contracts import strip_userinfo

    shown = strip_userinfo(url)
    assert all(secret not in shown for secret in ("hun", "ter2", "p?ss", "w@", "a@b", "x/y"))
    assert "127.0.0.1" in shown


def test_an_unreadable_config_file_is_one_line(config: Path) -> None:
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_bytes(b"url: http://h\ntoken: \xff\xfe\n")
    with pytest.raises(CliError, match="not UTF-8"):
        load_context()
