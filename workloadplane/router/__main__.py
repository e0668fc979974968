"""``python -m workloadplane.router …`` is ``gpufleet router …`` (the benchmarks use it)."""

from workloadplane.cli import router_main

router_main()
