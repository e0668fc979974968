"""The router's Prometheus metrics (``gpufleet_`` prefix) and the replicas' ``vllm:*`` ones.

Each Router app has its own registry. The replicas' metrics are fetched on scrape and passed
through unchanged except for an added ``replica`` label, families kept together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from workloadplane.router.load import RecentWindow

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80, 160)
SIZE_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class RouterMetrics:
    def __init__(
        self, also: Sequence[CollectorRegistry] = (), recent: RecentWindow | None = None
    ) -> None:
        """``also``: registries served beside the router's own (the agent's process
        metrics, when the router runs in the agent's process); ``recent``: the rolling
        window the plane's load reports read (median TTFT, service rate)."""
        self.also = tuple(also)
        self.recent = recent or RecentWindow()
        r = self.registry = CollectorRegistry(auto_describe=True)
        d = ["deployment"]
        self.requests = Counter(
            "gpufleet_router_requests",
            "Requests answered, by status code",
            [*d, "code"],
            registry=r,
        )
        self.shadow = Counter(
            "gpufleet_router_shadow_requests",
            "Copies of requests sent to a shadow lane, by outcome (answered, error, "
            "dropped: the shadow's bound was reached, or it had no room)",
            [*d, "outcome"],
            registry=r,
        )
        self.request_bytes = Histogram(
            "gpufleet_router_request_size_bytes",
            "Request body sizes",
            d,
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.response_bytes = Histogram(
            "gpufleet_router_response_size_bytes",
            "Response body sizes",
            d,
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gpufleet_router_time_to_first_token_seconds",
            "Arrival to the first response body byte (first token when streaming)",
            d,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "gpufleet_router_e2e_request_latency_seconds",
            "Arrival to the last response byte",
            d,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens_per_s = Histogram(
            "gpufleet_router_tokens_per_second",
            "Generated tokens per second of each request",
            d,
            buckets=RATE_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter(
            "gpufleet_router_input_tokens",
            "Prompt tokens of the requests answered (from the answers' usage)",
            d,
            registry=r,
        )
        self.output_tokens = Counter(
            "gpufleet_router_output_tokens",
            "Generated tokens of the requests answered (usage, else the stream's chunks)",
            d,
            registry=r,
        )
        self.queue_wait = Histogram(
            "gpufleet_router_queue_wait_seconds",
            "Time requests waited in the admission queue",
            d,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("gpufleet_router_queue_depth", "Requests waiting", d, registry=r)
        self.in_flight = Gauge(
            "gpufleet_router_requests_in_flight", "Requests on replicas", d, registry=r
        )
        self.replicas = Gauge(
            "gpufleet_router_replicas",
            "Replicas by phase (active = ready and not ejected)",
            [*d, "phase"],
            registry=r,
        )
        self.retries = Counter(
            "gpufleet_router_retries",
            "Requests retried on another replica",
            [*d, "reason"],
            registry=r,
        )
        self.ejections = Counter(
            "gpufleet_router_ejections", "Replicas ejected", [*d, "replica"], registry=r
        )

        self._per_deployment: dict[str, DeploymentMetrics] = {}
        self._codes: dict[tuple[str, str], Counter] = {}
        # every series labelled by deployment, with its label names (``prune``)
        self._by_deployment: list[tuple[Labelled, tuple[str, ...]]] = [
            (self.requests, ("deployment", "code")),
            (self.shadow, ("deployment", "outcome")),
            *((h, ("deployment",)) for h in (self.request_bytes, self.response_bytes)),
            *((h, ("deployment",)) for h in (self.ttft, self.e2e, self.tokens_per_s)),
            *((c, ("deployment",)) for c in (self.input_tokens, self.output_tokens)),
            (self.queue_wait, ("deployment",)),
            (self.queue_depth, ("deployment",)),
            (self.in_flight, ("deployment",)),
            (self.replicas, ("deployment", "phase")),
            (self.retries, ("deployment", "reason")),
            (self.ejections, ("deployment", "replica")),
        ]

    def of(self, deployment: str) -> DeploymentMetrics:
        """The per-request series of ``deployment``, looked up once (``labels()`` is slow)."""
        found = self._per_deployment.get(deployment)
        if found is None:
            found = self._per_deployment[deployment] = DeploymentMetrics(self, deployment)
        return found

    def answered(self, deployment: str, code: str) -> None:
        """Count a request answered with status ``code``."""
        counter = self._codes.get((deployment, code))
        if counter is None:
            counter = self._codes[deployment, code] = self.requests.labels(deployment, code)
        counter.inc()

    def ejected(self, deployment: str, replica_id: str) -> None:
        """Count a replica's ejection (by a failed request or a failed probe)."""
        self.ejections.labels(deployment, replica_id).inc()

    def prune(self, keep: set[str]) -> None:
        """Drop the series of deployments not in ``keep`` (no longer desired, last replica
        gone; every rollout lane would otherwise add label sets for good). A name that
        comes back starts its series from zero, as its counters do."""
        drop_series(self._by_deployment, {"deployment": keep})
        for name in [n for n in self._per_deployment if n not in keep]:
            del self._per_deployment[name]
        for key in [k for k in self._codes if k[0] not in keep]:
            del self._codes[key]

    def render(self) -> bytes:
        return generate_latest(self.registry) + b"".join(generate_latest(r) for r in self.also)


Labelled = Counter | Gauge | Histogram


def drop_series(
    metrics: Sequence[tuple[Labelled, tuple[str, ...]]], keep: dict[str, set[str]]
) -> None:
    """Remove from each (metric, its label names) the series whose value of a label named
    in ``keep`` is not among that label's values there (the values of names that left)."""
    for metric, names in metrics:
        gone = {
            tuple(sample.labels[n] for n in names)
            for family in metric.collect()
            for sample in family.samples
            if any(k in sample.labels and sample.labels[k] not in v for k, v in keep.items())
        }
        for labels in gone:
            metric.remove(*labels)


class DeploymentMetrics:
    """One deployment's labelled children of the per-request histograms."""

    def __init__(self, m: RouterMetrics, deployment: str) -> None:
        self.request_bytes = m.request_bytes.labels(deployment)
        self.response_bytes = m.response_bytes.labels(deployment)
        self.ttft = m.ttft.labels(deployment)
        self.e2e = m.e2e.labels(deployment)
        self.tokens_per_s = m.tokens_per_s.labels(deployment)
        self.input_tokens = m.input_tokens.labels(deployment)
        self.output_tokens = m.output_tokens.labels(deployment)
        self.queue_wait = m.queue_wait.labels(deployment)
        self.queue_depth = m.queue_depth.labels(deployment)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?(\s.*)$")


def relabel_vllm(text: str, replica: str, families: dict[str, list[str]]) -> None:
    """Add ``replica="…"`` to every ``vllm:`` line of ``text``, grouped into ``families``
    (family name → lines; the first replica's HELP/TYPE lines are kept once)."""
    current: str | None = None
    label = f'replica="{_escape(replica)}"'
    for line in text.splitlines():
        if line.startswith("# HELP vllm:") or line.startswith("# TYPE vllm:"):
            current = line.split()[2]
            lines = families.setdefault(current, [])
            if line not in lines:
                lines.append(line)
            continue
        if not line.startswith("vllm:") or current is None:
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, _, labels, rest = m.groups()
        body = f"{label},{labels}" if labels else label
        families[current].append(f"{name}{{{body}}}{rest}")


def render_families(families: dict[str, list[str]]) -> bytes:
    out: list[str] = []
    for lines in families.values():
        out += sorted(
            lines, key=lambda s: 0 if s.startswith("# HELP") else 1 if s.startswith("#") else 2
        )
    return ("\n".join(out) + "\n").encode() if out else b""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
