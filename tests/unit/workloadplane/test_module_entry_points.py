"""``python -m workloadplane.agent …`` is ``gpufleet agent …`` (bench/propagation.py starts
the agent that way): the command must get as far as checking its arguments, which is past the
import of the agent's own module, not crash on importing it a second time."""

from __future__ import annotations

import subprocess
import sys


def test_the_agent_started_as_a_module_gets_to_its_own_argument_checks() -> None:
    argv = ["--cluster", "x", "--router-url", "http://127.0.0.1:1", "--router-port", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "workloadplane.agent", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = " ".join(done.stderr.replace("│", " ").split())  # unboxed, unwrapped
    assert "or --router-port, not both" in said, done.stderr[-2000:]
    assert done.returncode == 2
