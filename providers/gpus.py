"""GPU type names in gpufleet's vocabulary (H100-80G, H200, A100-80G, L40S, L4, B200…)
from each provider's spelling ("H100", "nvidia-h100-80gb", "H100 (80 GB SXM5)")."""

from __future__ import annotations

import re

# Models whose memory differs between SKUs carry it in the name: "A100-40G" vs "A100-80G".
_SIZED = {"H100", "A100"}
_MODEL = re.compile(r"\b(GH200|GB200|B200|H200|H100|A100|A10G|A10|L40S|L40|L4|T4|V100|A6000)\b")
_GB = re.compile(r"(\d+)\s*GB\b")


def gpu_type(spelling: str, memory_mib: int | None = None) -> str:
    """Normalise a provider's GPU spelling; memory comes from `memory_mib` when given,
    else from a "<n> GB" / "-<n>gb" in the spelling. Unknown models are upper-cased."""
    text = spelling.upper().replace("NVIDIA", " ").replace("TESLA", " ").replace("_", " ")
    text = text.replace("-", " ")
    found = _MODEL.search(text)
    model = found.group(1) if found else spelling.strip().upper()
    if model not in _SIZED:
        return model
    if memory_mib:
        gib = round(memory_mib / 1024)
    else:
        size = _GB.search(text)
        gib = int(size.group(1)) if size else (80 if model == "H100" else 40)
    return f"{model}-{gib}G"
