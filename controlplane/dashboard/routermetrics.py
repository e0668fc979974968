"""A deployment's serving figures from its planes' routers (`GET /metrics`, Prometheus text):
requests by status, TTFT mean and p99, end-to-end p99, tokens per second, and each deployment's
request count (for the list's request rate, `rates.py`). The parsing and the quantile are pure;
`scrape` is the one network call, every router at once, each bounded by a short timeout, and a
router that does not answer is left out (the page says "not available")."""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import httpx
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "gpufleet_router_"
TIMEOUT_S = 0.3
MAX_BYTES = 4 * 1024 * 1024
"""The most of one /metrics answer read (a router's is a few kB per deployment)."""


@dataclass(frozen=True)
class Serving:
    requests: int
    errors: int
    ttft_mean_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    tokens_per_s_mean: float | None


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram (upper bound, count), linear in a bucket,
    as Prometheus' histogram_quantile; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * (
                (rank - lower_count) / width if width else 0
            )
        lower_bound, lower_count = bound, count
    return ordered[-1][0]


def serving(texts: Iterable[str], deployment: str) -> Serving | None:
    """One deployment's figures summed over routers' exposition texts; None if none has it."""
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    requests = errors = 0.0
    seen = False
    for text in texts:
        for family in text_string_to_metric_families(text):
            if not family.name.startswith(PREFIX):
                continue
            name = family.name.removeprefix(PREFIX)
            for s in family.samples:
                if s.labels.get("deployment") != deployment:
                    continue
                seen = True
                if s.name == f"{PREFIX}requests_total":
                    requests += s.value
                    errors += s.value if s.labels.get("code", "200")[:1] in ("4", "5") else 0
                elif s.name.endswith("_bucket"):
                    buckets[name][float(s.labels["le"])] += s.value
                elif s.name.endswith("_sum"):
                    sums[name] += s.value
                elif s.name.endswith("_count"):
                    counts[name] += s.value
    if not seen:
        return None

    def mean(name: str) -> float | None:
        return sums[name] / counts[name] if counts.get(name) else None

    def p99(name: str) -> float | None:
        return quantile(0.99, buckets[name].items()) if name in buckets else None

    return Serving(
        requests=int(requests),
        errors=int(errors),
        ttft_mean_s=mean("time_to_first_token_seconds"),
        ttft_p99_s=p99("time_to_first_token_seconds"),
        e2e_p99_s=p99("e2e_request_latency_seconds"),
        tokens_per_s_mean=mean("tokens_per_second"),
    )


def requests_by_deployment(text: str) -> dict[str, float]:
    """Deployment → requests the router answered (every status), from one exposition text."""
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if family.name != f"{PREFIX}requests":
            continue
        for s in family.samples:
            if s.name == f"{PREFIX}requests_total" and s.labels.get("deployment"):
                out[s.labels["deployment"]] += s.value
    return dict(out)


@cache
def _client(timeout_s: float) -> httpx.Client:
    """One client per process: building one (its TLS context) costs tens of milliseconds."""
    return httpx.Client(timeout=timeout_s)


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=16, thread_name_prefix="scrape")


def _fetch(url: str, timeout_s: float) -> str | None:
    """The exposition text at ``url``, or None: no answer, not a 200, more than
    ``MAX_BYTES``, longer than twice the timeout in all (the timeout bounds each read: a
    trickle of a byte a read never ended), or not Prometheus text (an HTML page on that
    port made every page that shows it a 500)."""
    deadline = time.monotonic() + 2 * timeout_s
    body = bytearray()
    try:
        with _client(timeout_s).stream("GET", url) as answer:
            if answer.status_code != 200:
                return None
            for chunk in answer.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES or time.monotonic() > deadline:
                    return None
    except httpx.HTTPError:
        return None
    text = body.decode("utf-8", errors="replace")
    try:
        for _ in text_string_to_metric_families(text):
            pass
    except Exception:  # whatever the parser makes of a stranger's text
        return None
    return text


def fetch_all(urls: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> dict[str, str | None]:
    """Name → the text at each URL, fetched concurrently; None where it did not answer in
    time (so a page waits about one timeout at most, however many are down)."""
    futures = {name: _pool().submit(_fetch, url, timeout_s) for name, url in urls.items()}
    done, _ = concurrent.futures.wait(futures.values(), timeout=3 * timeout_s)
    return {name: f.result() if f in done else None for name, f in futures.items()}


def scrape(urls: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> list[str]:
    """Each router's /metrics text; a router that does not answer in time is skipped."""
    texts = fetch_all({name: f"{base}/metrics" for name, base in urls.items()}, timeout_s)
    return [t for t in texts.values() if t is not None]
