"""The NATS credentials file of the agent, the router's load publisher and the gateway
(`--credentials-file`): defaults, and a bad file refused with what to change, exit 2, never
echoing the password."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workloadplane.cli import app
from workloadplane.natsconnect import CredentialsFileError, read_credentials

PASSWORD = "pw-0123456789-secret"


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "creds.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_user_and_inbox_default_to_the_partys_own(tmp_path: Path):
    creds = read_credentials(write(tmp_path, {"password": PASSWORD}), "gateway-a", "_INBOX.gw.a")
    assert (creds.user, creds.password, creds.inbox_prefix) == (
        "gateway-a",
        PASSWORD,
        "_INBOX.gw.a",
    )
    given = read_credentials(write(tmp_path, {"user": "u", "password": PASSWORD}), "x", "_I")
    assert given.user == "u"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("{user: 1}", "not a JSON object like"),
        ([PASSWORD], "not a JSON object like"),
        ({"user": "u"}, "password must be a non-empty string"),
        ({"user": "u", "password": 12345}, "password must be a non-empty string"),
        ({"user": 7, "password": PASSWORD}, "user must be a non-empty string"),
        ({"user": "u", "password": PASSWORD, "pasword": "x"}, "unknown field 'pasword'"),
    ],
)
def test_a_bad_file_names_what_to_change_and_never_the_password(tmp_path, data, says):
    with pytest.raises(CredentialsFileError) as err:
        read_credentials(write(tmp_path, data), "u", "_I")
    assert says in str(err.value)
    assert PASSWORD not in str(err.value)


def test_an_oversized_missing_or_endless_file_is_refused_without_reading_it_all(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"user": "u", "password": PASSWORD + " " * 70_000}))
    with pytest.raises(CredentialsFileError, match="over 65536 bytes") as err:
        read_credentials(big, "u", "_I")
    assert PASSWORD not in str(err.value)
    with pytest.raises(CredentialsFileError, match="no such file"):
        read_credentials(tmp_path / "missing.json", "u", "_I")
    with pytest.raises(CredentialsFileError, match="not a regular file"):
        read_credentials(Path("/dev/zero"), "u", "_I")  # read whole, it would never end


@pytest.mark.parametrize(
    "command",
    [
        ["agent", "--cluster", "c1"],
        ["router", "--cluster", "c1"],
        ["gateway", "--name", "g", "--region", "r"],
    ],
)
def test_each_process_exits_2_on_a_bad_credentials_file(tmp_path, command):
    bad = write(tmp_path, {"user": "u", "password": PASSWORD, "extra": 1})
    result = CliRunner().invoke(app, [*command, "--credentials-file", str(bad)])
    assert result.exit_code == 2, result.output
    assert "unknown field 'extra'" in result.output and "--credentials-file" in result.output
    assert PASSWORD not in result.output
