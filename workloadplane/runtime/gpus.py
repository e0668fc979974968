"""GPU assignment for replicas: real devices (``CUDA_VISIBLE_DEVICES``) or virtual ids.

Real GPUs are found with ``nvidia-smi``; without any, a configured number of virtual ids
stands in (so placement and GPU accounting behave the same on a laptop or in CI).
"""

from __future__ import annotations

import shutil
import subprocess


class InsufficientGpusError(RuntimeError):
    """Not enough free GPUs on this node for one more replica."""


def detect_gpus() -> list[str]:
    """Indices of the real NVIDIA GPUs on this machine (empty if none or no driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


class GpuAllocator:
    def __init__(self, gpus: list[str], *, real: bool) -> None:
        self.real = real
        self._free = list(gpus)
        self._all = list(gpus)

    @classmethod
    def for_this_machine(cls, virtual_gpus: int = 8) -> GpuAllocator:
        real = detect_gpus()
        if real:
            return cls(real, real=True)
        return cls([f"virtual-{i}" for i in range(virtual_gpus)], real=False)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def total(self) -> int:
        return len(self._all)

    def allocate(self, count: int) -> list[str]:
        if count > len(self._free):
            kind = "GPUs" if self.real else "virtual GPUs"
            raise InsufficientGpusError(
                f"a replica needs {count} {kind} but {len(self._free)} of {len(self._all)} are "
                "free: stop a replica or lower gpus_per_replica"
            )
        taken, self._free = self._free[:count], self._free[count:]
        return taken

    def take(self, gpus: list[str]) -> None:
        """Mark ``gpus`` as used (adopting a running replica)."""
        self._free = [g for g in self._free if g not in gpus]

    def release(self, gpus: list[str]) -> None:
        for g in gpus:
            if g in self._all and g not in self._free:
                self._free.append(g)
        self._free.sort(key=self._all.index)

    def env(self, gpus: list[str]) -> dict[str, str]:
        if self.real:
            return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        return {"GPUFLEET_VIRTUAL_GPUS": ",".join(gpus), "CUDA_VISIBLE_DEVICES": ""}
