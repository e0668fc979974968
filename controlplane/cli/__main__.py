"""`python -m controlplane.cli …`: the control plane's commands only (`up` runs `bus` so);
`python -m gpufleet_cli …` is the whole `gpufleet` command."""

from controlplane.cli import app

app()
