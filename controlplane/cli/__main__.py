"""`python -m controlplane.cli …` is `gpufleet …` (used by `up` for its children)."""

from controlplane.cli import app

app()
