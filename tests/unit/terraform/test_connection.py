"""The Terraform provider's login lookup (infra/terraform/gpufleet_tf/connection.py), run
without Terraform: its module needs only the standard library and PyYAML."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[3] / "infra" / "terraform"))
connection = importlib.import_module("gpufleet_tf.connection")  # its own package, no `tf`


def test_a_broken_login_file_is_named_without_echoing_its_token(tmp_path: Path):
    """PyYAML's error quotes the offending line: the token, shown in Terraform's
    diagnostics (and CI logs) before."""
    path = tmp_path / "config.yaml"
    path.write_text("url: http://127.0.0.1:8000\ntoken: gpf_SECRETSECRET: x\n")
    with pytest.raises(connection.ConnectionError_) as raised:
        connection.read_login(path)
    message = str(raised.value)
    assert "SECRET" not in message
    assert str(path) in message and "line 2" in message and "gpufleet login" in message
