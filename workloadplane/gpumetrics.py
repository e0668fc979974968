"""GPU utilisation and memory from NVIDIA's NVML, on the agent's ``/metrics``, when the
machine has NVIDIA GPUs and the ``nvidia-ml-py`` package (module ``pynvml``).

vLLM's own gauges say how full its KV cache is (``vllm:kv_cache_usage_perc``), not how busy
the GPU is; NVML does. Read at each scrape (no thread, no cache); a device NVML cannot read
is left out of that scrape and counted in ``gpufleet_gpu_read_errors``. Without the package
or a driver (this CPU-only machine) nothing is registered and the agent runs as before.
On Kubernetes, NVIDIA's DCGM exporter gives the same figures and more.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class NvmlCollector(Collector):
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors = 0

    def collect(self) -> Iterator[Any]:
        labels = ["gpu", "uuid", "name"]
        util = GaugeMetricFamily(
            "gpufleet_gpu_utilisation_ratio",
            "Share of the last sample period a kernel ran on the GPU (NVML)",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "gpufleet_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=labels
        )
        total = GaugeMetricFamily(
            "gpufleet_gpu_memory_total_bytes", "GPU memory installed (NVML)", labels=labels
        )
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # the driver went away: nothing this scrape
            self._failed("count", exc)
            count = 0
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                values = [str(i), _text(nvml.nvmlDeviceGetUUID(handle)),
                          _text(nvml.nvmlDeviceGetName(handle))]  # fmt: skip
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                self._failed(f"device {i}", exc)
                continue
            util.add_metric(values, rates.gpu / 100.0)
            used.add_metric(values, float(memory.used))
            total.add_metric(values, float(memory.total))
        errors = CounterMetricFamily(
            "gpufleet_gpu_read_errors", "NVML reads that failed (a device left out of a scrape)"
        )
        errors.add_metric([], self.errors)
        yield from (util, used, total, errors)

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        log.warning("NVML could not read %s: %s", what, exc)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def register_nvml(
    registry: CollectorRegistry = REGISTRY,
    load: Callable[[str], ModuleType] = importlib.import_module,
) -> bool:
    """Serve the GPUs' figures from ``registry`` when NVML is there; True if it is."""
    try:
        nvml = load("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # no package, no driver, no GPU: a CPU machine
        log.debug("no NVML GPU metrics: %s", exc)
        return False
    registry.register(NvmlCollector(nvml))
    log.info("GPU metrics from NVML on /metrics")
    return True
