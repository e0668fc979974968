"""``python -m gpufleet_cli …`` is ``gpufleet …`` (used by ``gpufleet up`` for its children)."""

from gpufleet_cli import app

app()
