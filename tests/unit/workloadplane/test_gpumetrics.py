"""GPU figures from NVML on the agent's /metrics: read at each scrape, a device NVML cannot
read left out and counted, nothing registered where there is no NVML."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from workloadplane.gpumetrics import register_nvml


class FakeNvml(ModuleType):
    """pynvml's calls used, over two GPUs; ``broken`` makes device 1 fail to read."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.broken = False
        self.busy = [37, 90]

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i == 1 and self.broken:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.busy[h], memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30)


def test_each_scrape_reads_every_gpu_and_a_lost_one_is_left_out_and_counted():
    nvml, registry = FakeNvml(), CollectorRegistry()
    assert register_nvml(registry, lambda name: nvml)

    def value(name: str, gpu: str) -> float | None:
        labels = {"gpu": gpu, "uuid": f"GPU-{gpu}", "name": "NVIDIA H100 80GB HBM3"}
        return registry.get_sample_value(name, labels)

    assert value("gpufleet_gpu_utilisation_ratio", "0") == pytest.approx(0.37)
    assert value("gpufleet_gpu_memory_used_bytes", "1") == 2 * 2**30
    assert value("gpufleet_gpu_memory_total_bytes", "0") == 80 * 2**30
    nvml.busy[0] = 5  # read at the scrape, not cached
    assert value("gpufleet_gpu_utilisation_ratio", "0") == pytest.approx(0.05)
    nvml.broken = True
    text = generate_latest(registry).decode()
    assert 'gpu="1"' not in text and 'gpu="0"' in text
    # one failed read per scrape that missed it: the one above and this one
    assert registry.get_sample_value("gpufleet_gpu_read_errors_total") == 2


def test_without_nvml_nothing_is_registered():
    registry = CollectorRegistry()

    def missing(name: str) -> ModuleType:
        raise ModuleNotFoundError(f"No module named {name!r}")

    assert not register_nvml(registry, missing)
    assert generate_latest(registry) == b""
