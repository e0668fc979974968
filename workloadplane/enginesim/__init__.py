"""Engine simulator: a vLLM-compatible replica without a model, for demos and load tests.

Same OpenAI routes, SSE format and ``vllm:*`` metrics as a real vLLM server, with continuous
batching, a KV-block budget, a token rate and a cold start. It never stands in for vLLM in the
tests that need a real engine. Run it with ``python -m workloadplane.enginesim --port P``.
"""

from workloadplane.enginesim.app import Simulator, create_app
from workloadplane.enginesim.engine import EngineConfig

__all__ = ["EngineConfig", "Simulator", "create_app"]
