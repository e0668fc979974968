"""The CLI against a live API: uvicorn on a free port over the session's database.

Each test starts with an empty database and one token per role (the API suite's `tokens`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner, Result

from controlplane.api.app import create_app
from controlplane.cli import app
from controlplane.local.ports import free_port
from controlplane.settings import Settings


@pytest.fixture(scope="session")
def api_url(database_url: str, session_factory: sessionmaker[Session]) -> Iterator[str]:
    api = create_app(Settings(database_url=database_url), session_factory=session_factory)
    port = free_port()
    config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="cli-test-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "API did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


class Cli:
    """Runs `gpufleet …` in-process with a given URL and token, and a private config file."""

    def __init__(self, url: str, token: str | None, config: Path) -> None:
        self.url, self.config = url, config
        # None unsets a variable, so the developer's own GPUFLEET_* never leak in.
        self.env: dict[str, str | None] = {
            "GPUFLEET_URL": url,
            "GPUFLEET_TOKEN": token,
            "GPUFLEET_CONFIG": str(config),
            "COLUMNS": "200",
        }
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return self.runner.invoke(app, list(args), input=input, env=self.env)

    def as_token(self, token: str | None) -> Cli:
        return Cli(self.url, token, self.config)


@pytest.fixture
def cli(api_url: str, tokens: dict[str, str], tmp_path: Path) -> Cli:
    return Cli(api_url, tokens["admin"], tmp_path / "config.yaml")
