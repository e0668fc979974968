"""Each test configures the process's logging into a buffer; the root logger and the
adopted servers' loggers are put back afterwards (pytest's own capture stays in place)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpufleet_logging import configure_logging
from gpufleet_logging.configure import ADOPTED_LOGGERS, QUIET_LOGGERS

PER_TASK_LOGGERS = ("celery.app.trace", "celery.worker.strategy")  # the worker's (tasks.py)

Configure = Callable[..., io.StringIO]


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """Whatever the test configures (it, or a Celery worker it starts), put back after."""
    loggers = [
        logging.getLogger(n) for n in ("", *ADOPTED_LOGGERS, *QUIET_LOGGERS, *PER_TASK_LOGGERS)
    ]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


@pytest.fixture
def configured(logging_restored: None) -> Configure:
    def configure(process: str = "router", **env: str) -> io.StringIO:
        buffer = io.StringIO()
        configure_logging(process, env=env, stream=buffer)
        return buffer

    return configure


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line]
