"""The OpenAI-compatible front of a workload plane (see docs/router.md): state in ``core``,
the retry policy in ``dispatch``, health probes in ``prober``, HTTP in ``app``."""

from workloadplane.router.app import RouterApp
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.dispatch import Dispatcher
from workloadplane.router.prober import Prober

__all__ = ["Dispatcher", "Prober", "Router", "RouterApp", "RouterConfig"]
