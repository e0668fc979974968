"""The local fleet's own credential files."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from controlplane.contracts import gateway_inbox_prefix
from controlplane.local.secrets import Secrets


def test_a_gateway_file_from_before_the_inbox_prefix_moved_is_brought_up_to_date(tmp_path: Path):
    """The server's permissions follow the current prefix: a gateway left on the old one
    (`_INBOX_gateway-<name>`) would get no reply on its inbox after an upgrade."""
    secrets = Secrets(tmp_path)
    path, first = secrets.gateway("use1")
    assert first.inbox_prefix == gateway_inbox_prefix("use1") == "_INBOX_GW_use1"
    path.write_text(json.dumps({**first.model_dump(), "inbox_prefix": "_INBOX_gateway-use1"}))

    again_path, again = secrets.gateway("use1")

    assert again.inbox_prefix == "_INBOX_GW_use1" and again.password == first.password
    assert json.loads(again_path.read_text())["inbox_prefix"] == "_INBOX_GW_use1"
    assert stat.S_IMODE(again_path.stat().st_mode) == 0o600


def test_a_damaged_credentials_file_is_named_and_its_password_never_shown(tmp_path: Path):
    from controlplane.local.supervisor import UpError

    secrets = Secrets(tmp_path)
    path, _ = secrets.gateway("use1")
    path.write_text('{"user": "gateway-use1", "password": "SECRETSECRETSECRET')  # cut short
    with pytest.raises(UpError) as raised:
        secrets.gateway("use1")
    assert str(path) in str(raised.value) and "SECRET" not in str(raised.value)
    (tmp_path / "nats-controlplane.json").write_text('{"user": 1, "password": "SECRETSECRET"}')
    with pytest.raises(UpError) as raised:
        secrets.controlplane()
    assert "SECRET" not in str(raised.value)
