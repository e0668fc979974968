"""The OpenAI-compatible front of a workload plane (see docs/router.md)."""

from workloadplane.router.app import RouterApp
from workloadplane.router.core import Router, RouterConfig

__all__ = ["Router", "RouterApp", "RouterConfig"]
