"""Replica runtimes: how a workload plane runs vLLM replicas (processes, pods, …)."""

from workloadplane.runtime.base import Runtime

__all__ = ["Runtime"]
