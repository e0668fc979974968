"""Failures read as one line with a non-zero exit; login stores a private config file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from controlplane.local.ports import free_port
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_story import FLEET


def _one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


def test_bad_yaml_names_file_and_line(cli: Cli, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Pool\nname: a\ngpus: [1, 2\nprice: 3\n")
    result = cli("apply", "-f", str(broken), "--yes")
    assert result.exit_code == 2
    line = _one_line(result.output)
    assert line.startswith(f"error: {broken}:") and "not valid YAML" in line


def test_local_validation_error_is_one_line_and_writes_nothing(cli: Cli, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.replace("gpus: 64", "gpus: -1"))
    result = cli("apply", "-f", str(fleet), "--yes")
    assert result.exit_code == 2
    assert _one_line(result.output) == (
        f"error: {fleet}:10: pools 'aws-use1-h100-od': gpus: Input should be greater than or "
        "equal to 0"
    )
    assert cli("get", "providers", "-o", "name").output == ""
    assert cli("diff", "-f", str(fleet)).exit_code == 2


def test_server_side_error_names_object_field_and_progress(cli: Cli, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.replace("provider: aws-main\nregion", "provider: nope\nregion"))
    result = cli("apply", "-f", str(fleet), "--yes")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: pools 'aws-use1-h100-od': provider: no provider named 'nope'; create it first "
        "or fix the name (3 of 6 changes applied; fix it and apply again)"
    ]


def test_apply_asks_and_refuses_without_a_terminal(cli: Cli, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    result = cli("apply", "-f", str(fleet))
    assert result.exit_code == 1
    assert "stdin is not a terminal; pass --yes" in result.output
    assert "6 to create" in result.output
    assert cli("get", "providers", "-o", "name").output == ""
    from_stdin = cli("apply", "-f", "-", input=FLEET)
    assert from_stdin.exit_code == 1 and "pass --yes" in from_stdin.output


def test_roles_and_missing_objects(cli: Cli, tokens: dict[str, str], tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    viewer = cli.as_token(tokens["viewer"])
    refused = viewer("apply", "-f", str(fleet), "--yes")
    assert refused.exit_code == 1
    assert refused.output.splitlines()[-1].startswith("error: providers 'aws-main': ")
    missing = cli("delete", "pool", "nope")
    assert missing.exit_code == 1
    assert _one_line(missing.output) == (
        "error: pools 'nope' not found; list them with `gpufleet get pools`"
    )
    unknown = cli("get", "flavours")
    assert unknown.exit_code == 2 and _one_line(unknown.output).startswith("error: unknown kind")
    anonymous = cli.as_token(None)("get", "pools")
    assert anonymous.exit_code == 1 and "gpufleet login" in _one_line(anonymous.output)


def test_unreachable_control_plane(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = Cli(url, "gpf_x", tmp_path / "config.yaml")("get", "pools")
    assert result.exit_code == 1
    assert _one_line(result.output).startswith(
        f"error: cannot reach the control plane at {url} (connection refused); is `gpufleet "
        "up` running?"
    )
    diff = Cli(url, "gpf_x", tmp_path / "config.yaml")("diff", "-f", "-", input=FLEET)
    assert diff.exit_code == 2


def test_login_verifies_and_writes_a_private_file(cli: Cli, tokens: dict[str, str]) -> None:
    anonymous = cli.as_token(None)
    anonymous.env["GPUFLEET_URL"] = None
    token = tokens["operator"]

    refused = anonymous("login", "--url", cli.url, "--token", "gpf_wrong")
    assert refused.exit_code == 1 and "login failed" in refused.output
    assert not cli.config.exists()

    ok = anonymous("login", "--url", cli.url + "/", "--token", token)
    assert ok.exit_code == 0, ok.output
    assert token not in ok.output and token[:10] in ok.output
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600
    shown = anonymous("context")
    assert token not in shown.output
    assert f"url:    {cli.url}\n" in shown.output and str(cli.config) in shown.output

    pools = anonymous("get", "pools", "-o", "json")  # url and token from the file
    assert pools.exit_code == 0, pools.output
    assert json.loads(pools.output) == {"items": []}


def test_a_frozen_control_plane_is_named_within_the_timeout(tmp_path: Path) -> None:
    """The kernel accepts the connection but nothing ever answers (a SIGSTOPped API)."""
    import socket
    import time

    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen()
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        cli = Cli(url, "gpf_x", tmp_path / "config.yaml")
        cli.env["GPUFLEET_CLI_TIMEOUT"] = "1"
        started = time.monotonic()
        result = cli("get", "pools")
        waited = time.monotonic() - started
    assert result.exit_code == 1
    assert _one_line(result.output).startswith(
        f"error: the API at {url} did not answer in 1 s; it may be overloaded or stopped"
    )
    assert waited < 5, f"waited {waited:.1f} s"


def test_a_bad_timeout_setting_says_what_to_set(tmp_path: Path) -> None:
    cli = Cli(f"http://127.0.0.1:{free_port()}", "gpf_x", tmp_path / "config.yaml")
    cli.env["GPUFLEET_CLI_TIMEOUT"] = "soon"
    result = cli("get", "pools")
    assert result.exit_code == 1
    assert "GPUFLEET_CLI_TIMEOUT='soon' is not a number of seconds" in result.output


def test_a_mistyped_url_is_one_line_saying_what_a_url_looks_like(tmp_path: Path) -> None:
    """An O for a 0 in the port: an httpx.InvalidURL traceback before."""
    for url in ("http://127.0.0.1:808O", "http://[::1"):
        result = Cli(url, "gpf_x", tmp_path / "config.yaml")("get", "pools")
        assert result.exit_code == 1
        assert _one_line(result.output).startswith(f"error: {url!r} is not a URL the CLI can use")
        assert "http://127.0.0.1:8080" in result.output and "Traceback" not in result.output
