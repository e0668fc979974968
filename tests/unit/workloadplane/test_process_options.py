"""The workload plane's processes (agent, router, gateway) refuse a bad option at start:
exit 2 with what to change, before anything runs (no traceback, no process that then logs
errors for ever or listens on a port it was not given)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from workloadplane.cli import app

GW = ["gateway", "--name", "g", "--region", "aws-us-east-1"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["router", "--replica", "chat"], "write DEPLOYMENT=http://HOST:PORT"),
        (["router", "--replica", "=http://127.0.0.1:8001"], "write DEPLOYMENT=http://HOST:PORT"),
        (["router", "--replica", "chat=notaurl"], "is not a URL like http://127.0.0.1:8001"),
        (["router", "--replica", "chat=http://127.0.0.1:0"], "a port is 1 to 65535"),
        (["router", "--replica", "chat=https://127.0.0.1:8001"], "write http://"),
        (["router", "--replica", "chat=http://[::1]:8001"], "not IPv6"),
        (["router", "--replica", "chat=http://a b:8001"], "is not a URL like"),
        (["router", "--replica", "chat=http://u:pw@h:8001"], "takes no user:password"),
        (["router", "--port", "99999"], "65535"),
        (["router", "--port", "0"], "--port"),
        (["router", "--concurrency", "0"], "--concurrency"),
        (["router", "--queue-max-wait", "nan"], "give seconds above 0 and at most 86400"),
        (["router", "--load-interval", "-1"], "give seconds above 0.01 and at most 60"),
        (["router", "--max-body-bytes", "-5"], "1024"),
        (["router", "--cluster", "Bad"], "invalid cluster name 'Bad'"),
        (["gateway", "--name", "a/b", "--region", "x"], "invalid cluster name 'a/b'"),
        (["gateway", "--name", "g", "--region", "US East"], "invalid region name 'US East'"),
        ([*GW, "--port", "70000"], "65535"),
        ([*GW, "--max-body-bytes", "0"], "1024"),
        (["agent", "--cluster", "bad/name"], "invalid cluster name 'bad/name'"),
        (["agent", "--cluster", "c\n"], "invalid cluster name"),
        (["agent", "--cluster", "c", "--router-url", "localhost:8000"], "is not a URL like"),
        (["agent", "--cluster", "c", "--router-port", "-1"], "--router-port"),
        (["agent", "--cluster", "c", "--heartbeat-interval", "0"], "give seconds above 0.05"),
        (["agent", "--cluster", "c", "--drain-lead", "-1"], "give seconds at least 0"),
        (["agent", "--cluster", "c", "--metrics-port", "65536"], "65535"),
    ],
)
def test_a_bad_option_exits_2_naming_what_to_change(argv, says):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.replace("│", " ").split())


def test_a_password_in_a_url_is_never_echoed():
    result = CliRunner().invoke(app, ["router", "--replica", "chat=https://u:s3cret@h:8001"])
    assert result.exit_code == 2 and "s3cret" not in result.output


def test_a_router_url_with_a_path_is_taken_as_its_host_and_port():
    from workloadplane.cli import _endpoint
    from workloadplane.router.upstream import host_port

    url = _endpoint("http://127.0.0.1:8001/v1")  # accepted, as the help says ...
    assert host_port(url) == ("127.0.0.1", 8001)  # ... and what the agent dials


def test_an_engine_inherits_no_secret_of_the_agents_environment(monkeypatch):
    """An engine runs model code: gpufleet's settings, passwords and cloud keys stay with
    the agent; the log settings and HF_TOKEN (to load models) go with it."""
    from workloadplane.runtime.process import _engine_environ

    for name in ("GPUFLEET_NATS_PASSWORD", "GPUFLEET_DATABASE_URL", "AWS_SECRET_ACCESS_KEY",
                 "AZURE_CLIENT_SECRET", "PG_PASSWORD", "LAMBDA_CREDS"):  # fmt: skip
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("GPUFLEET_LOG_FORMAT", "json")
    monkeypatch.setenv("HF_TOKEN", "hf")
    env = _engine_environ()
    assert not {"GPUFLEET_NATS_PASSWORD", "GPUFLEET_DATABASE_URL", "AWS_SECRET_ACCESS_KEY",
                "AZURE_CLIENT_SECRET", "PG_PASSWORD", "LAMBDA_CREDS"} & set(env)  # fmt: skip
    assert env["GPUFLEET_LOG_FORMAT"] == "json" and env["HF_TOKEN"] == "hf"
