"""A user:password written into a URL (GPUFLEET_NATS_URL, GPUFLEET_URL) is never printed: not
in the NATS retry line every plane process logs while NATS is down, not in the CLI's
"cannot reach" line, and not handed to a workload-plane process (it has its own user)."""

from __future__ import annotations

import logging
import sys

import pytest

from controlplane.cli.client import Client
from controlplane.cli.config import Context
from controlplane.cli.manifests import CliError
from controlplane.contracts import strip_userinfo
from controlplane.local.supervisor import Child


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://cp:S3CRET@nats:4222", "nats://nats:4222"),
        ("nats://cp:S3CRET@a:1,nats://b:2,nats://u:p@c:3", "nats://a:1,nats://b:2,nats://c:3"),
        ("https://u:S3CRET@cp.example/api?x=1", "https://cp.example/api?x=1"),
        ("tok3n@host:4222", "host:4222"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ],
)
def test_strip_userinfo(url: str, shown: str) -> None:
    assert strip_userinfo(url) == shown


async def test_the_nats_retry_line_never_shows_a_password(monkeypatch, caplog) -> None:
    import workloadplane.natsconnect as natsconnect

    calls = []

    async def connect(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise OSError("connection refused")
        return "connected"

    monkeypatch.setattr(natsconnect.nats, "connect", connect)
    with caplog.at_level(logging.WARNING):
        got = await natsconnect.connect_until_up(
            "nats://cp:S3CRET@127.0.0.1:1", "t", None, why_waiting="waiting", first_delay_s=0
        )
    assert got == "connected"
    assert "cannot reach NATS at nats://127.0.0.1:1" in caplog.text
    assert "S3CRET" not in caplog.text


def test_the_cli_never_prints_a_password_from_its_url() -> None:
    client = Client(Context(url="http://u:S3CRET@127.0.0.1:1", token=None, source="test"), 1.0)
    with pytest.raises(CliError) as caught:
        client.get("/pools")
    assert "127.0.0.1:1" in str(caught.value) and "S3CRET" not in str(caught.value)


def test_a_plane_process_gets_the_nats_url_without_the_control_planes_password(tmp_path):
    script = "import os; print(os.environ['GPUFLEET_NATS_URL'])"
    child = Child("agent-x", [sys.executable, "-c", script], plane=True)
    child.start({"GPUFLEET_NATS_URL": "nats://controlplane:S3CRET@127.0.0.1:4222"}, tmp_path, 0)
    assert child.process is not None and child.process.wait(10) == 0
    assert (tmp_path / "agent-x.log").read_text().strip() == "nats://127.0.0.1:4222"
