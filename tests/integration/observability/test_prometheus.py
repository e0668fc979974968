"""A real Prometheus (Debian's package, installed when missing) scrapes a live `gpufleet up`
fleet through the configuration and file_sd target lists `up` writes (docs/observability.md):
every target is up (API, bus process, Celery worker, agents, routers, gateways, replicas), their
series have data, and a cluster created
with an endpoint joins the scrape (and leaves it when deleted) without a reload."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from controlplane.local.ports import free_port
from tests.integration.dashboard.conftest import Fleet, fleet, wait_until  # noqa: F401 - fixture
from tests.integration.debian import installed

pytestmark = pytest.mark.integration


def prometheus_binary() -> str:
    return installed("prometheus")  # promtool comes with it


@pytest.fixture(scope="module")
def prometheus(fleet: Fleet) -> Iterator[str]:  # noqa: F811 - the fixture above
    port = free_port()
    store = Path(tempfile.mkdtemp(prefix="gpufleet-prom-"))
    config = fleet.data_dir / "prometheus" / "prometheus.yml"
    proc = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={store}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(store / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 60, "Prometheus to start")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(store, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def targets(url: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]


def query(url: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


EVERY_JOB = {
    f"gpufleet-{job}" for job in ("api", "bus", "worker", "agent", "router", "gateway", "replica")
}


def test_every_process_is_scraped_and_its_series_have_data(fleet: Fleet, prometheus: str):  # noqa: F811
    fleet.api.get("/api/v1/pools")
    body = {"model": "triage-llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def served() -> bool:
        answer = httpx.post(f"{fleet.gateways['use1']}/v1/chat/completions", json=body, timeout=30)
        return answer.status_code == 200

    wait_until(served, 90, "gateway use1 to serve a request (through a plane's router)")

    def all_up() -> bool:
        found = targets(prometheus)
        jobs = {t["labels"]["job"] for t in found if t["health"] == "up"}
        return jobs >= EVERY_JOB and all(t["health"] == "up" for t in found)

    wait_until(all_up, 60, "every target of up's fleet to be scraped and up")
    found = targets(prometheus)
    routers = sorted(
        t["labels"]["cluster"] for t in found if t["labels"]["job"] == "gpufleet-router"
    )
    assert routers == ["euc1-a", "local-a", "use1-a"]
    gateways = sorted(
        t["labels"]["gateway"] for t in found if t["labels"]["job"] == "gpufleet-gateway"
    )
    assert gateways == ["euc1", "use1"]
    agents = sorted(t["labels"]["cluster"] for t in found if t["labels"]["job"] == "gpufleet-agent")
    assert agents == ["euc1-a", "local-a", "use1-a"]

    def replica_scraped() -> bool:  # up lists replicas as their agents record them: a
        # replica that started after the other targets were up may take a refresh more
        return any(
            t["labels"]["job"] == "gpufleet-replica"
            and t["labels"].get("deployment") == "triage-llm"
            and t["health"] == "up"
            for t in targets(prometheus)
        )

    wait_until(replica_scraped, 60, "the triage-llm replica to be discovered and scraped")

    def has(expr: str) -> bool:
        return bool(query(prometheus, expr))

    wait_until(
        lambda: has('gpufleet_api_requests_total{route="/api/v1/pools",code="200"}'),
        30,
        "the API's request count",
    )
    wait_until(lambda: has("gpufleet_api_request_duration_seconds_bucket"), 30, "API latency")
    wait_until(lambda: has("sum(gpufleet_gateway_requests_total) > 0"), 30, "the gateways' count")
    wait_until(lambda: has("sum(gpufleet_router_requests_total) > 0"), 30, "the routers' count")
    # the fleet's state, read from PostgreSQL at each scrape of the API
    wait_until(lambda: has("gpufleet_fleet_state_readable == 1"), 30, "the fleet gauges")
    states = {
        r["metric"]["cluster"]: r["metric"]["state"]
        for r in query(prometheus, "gpufleet_cluster_state")
    }
    assert states == {"euc1-a": "healthy", "local-a": "healthy", "use1-a": "healthy"}, states
    assert has('gpufleet_reservation_committed_gpus{pool="aws-use1-h100-reserved"} > 0')
    assert has('gpufleet_deployment_placed_replicas{deployment="triage-llm"} > 0')
    assert has("gpufleet_fleet_cost_dollars_per_hour > 0")
    assert has("max(gpufleet_cluster_heartbeat_age_seconds) < 30")
    # the processes without a port of their own: the bus process, the Celery worker, agents
    wait_until(lambda: has("sum(gpufleet_bus_received_messages_total) > 0"), 30, "bus reports")
    wait_until(lambda: has("gpufleet_bus_report_delay_seconds_count > 0"), 30, "report delay")
    wait_until(lambda: has("gpufleet_bus_pending_messages >= 0"), 30, "the bus's backlog")
    wait_until(
        lambda: has('gpufleet_task_runs_total{task="gpufleet.check_clusters",outcome="success"}'),
        30,
        "the worker's task runs",
    )
    wait_until(lambda: has("gpufleet_replan_cost_dollars_per_hour > 0"), 60, "a re-plan")
    wait_until(
        lambda: has('gpufleet_agent_replicas{cluster="use1-a",state="ready"} > 0'),
        30,
        "the agents' replicas",
    )
    assert has("max(time() - gpufleet_agent_heartbeat_timestamp_seconds) < 30")
    assert has("gpufleet_agent_reconcile_duration_seconds_count > 0")
    # each replica's engine: vLLM's series (engine-sim's here) and its process' CPU and memory
    wait_until(
        lambda: has('vllm:num_requests_running{job="gpufleet-replica",deployment="triage-llm"}'),
        30,
        "a replica's engine metrics",
    )
    assert has('process_resident_memory_bytes{job="gpufleet-replica"} > 0')


def test_the_api_metrics_need_a_token(fleet: Fleet):  # noqa: F811
    """The fleet's names and sizes are not public: Prometheus has a viewer token of its own."""
    assert httpx.get(f"{fleet.url}/metrics", timeout=5).status_code == 401
    token = (fleet.data_dir / "prometheus" / "token").read_text()
    assert (fleet.data_dir / "prometheus" / "token").stat().st_mode & 0o777 == 0o600
    tokens = fleet.api.get("/api/v1/tokens").json()["items"]
    assert [t["role"] for t in tokens if t["name"].startswith("prometheus-")] == ["viewer"]
    answer = httpx.get(f"{fleet.url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200 and "gpufleet_api_requests_total" in answer.text


def test_a_cluster_created_with_an_endpoint_joins_the_scrape_and_leaves_it(
    fleet: Fleet,  # noqa: F811
    prometheus: str,
):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing answers there: a down target
    made = fleet.api.post(
        "/api/v1/clusters",
        json={
            "name": "scraped-b",
            "region": "aws-us-east-1",
            "pools": ["aws-use1-h100-od"],
            "endpoint": endpoint,
        },
    )
    assert made.status_code == 201, made.text

    def listed() -> list[dict]:
        return [t for t in targets(prometheus) if t["labels"].get("cluster") == "scraped-b"]

    wait_until(lambda: bool(listed()), 45, "Prometheus to discover the new cluster's router")
    assert listed()[0]["scrapeUrl"] == f"{endpoint}/metrics"
    assert fleet.api.delete("/api/v1/clusters/scraped-b").status_code == 204
    wait_until(lambda: not listed(), 45, "the deleted cluster's router to leave the scrape")


REPO = Path(__file__).resolve().parents[3]
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def queries() -> list[str]:
    """Every PromQL expression of the alert rules and the Grafana dashboards."""
    rules = yaml.safe_load((REPO / "infra" / "prometheus" / "rules.yml").read_text())
    found = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for board in sorted((REPO / "infra" / "grafana").glob("*.json")):
        for panel in json.loads(board.read_text())["panels"]:
            found += [t["expr"].replace("$deployment", ".*") for t in panel["targets"]]
    return found


def test_every_query_of_the_rules_and_dashboards_runs_and_names_real_metrics(
    fleet: Fleet,  # noqa: F811
    prometheus: str,
):
    """No typo'd metric name: each one a rule or panel uses is one the fleet's processes
    expose (Prometheus' metadata from the scrapes), and each expression evaluates."""
    fleet.api.get("/api/v1/pools")  # the API has answered something worth counting
    wait_until(lambda: bool(query(prometheus, "gpufleet_api_requests_total")), 60, "a scrape")
    # names with samples, and names the scrapes described (a labelled counter that never
    # counted, e.g. failovers, has its # HELP/# TYPE but no sample yet)
    names = httpx.get(f"{prometheus}/api/v1/label/__name__/values", timeout=5).json()["data"]
    metadata = httpx.get(f"{prometheus}/api/v1/metadata", timeout=5).json()["data"]
    known = set(names) | set(metadata)
    unknown: dict[str, str] = {}
    for expr in queries():
        answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=5)
        assert answer.json()["status"] == "success", (expr, answer.text)
        for name in set(re.findall(r"\bgpufleet_[a-z0-9_]+", expr)):
            stems = {name} | {name.removesuffix(s) for s in SUFFIXES}
            if not stems & known:
                unknown[name] = expr
    assert not unknown, f"metrics no process exposes: {unknown}"
