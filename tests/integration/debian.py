"""Debian packages the tests need, installed with apt when missing (they must install what
they use: a fresh machine has neither Chromium nor Prometheus)."""

from __future__ import annotations

import shutil
import subprocess


def installed(binary: str, package: str | None = None) -> str:
    """The path of ``binary``, installing Debian's ``package`` (default: the binary's name)
    first when it is missing."""
    found = shutil.which(binary)
    if found is None:
        subprocess.run(["apt-get", "install", "-y", "-q", package or binary], check=True)
        found = shutil.which(binary)
    assert found, f"Debian's {package or binary} is needed: apt-get install -y {package or binary}"
    return found
