"""Dashboard page server time, on the demo fleet and on a bench-size fleet (2,000 pools,
10,000 replicas), next to the API's own list of 50 pools measured in the same run.

Each page is rendered in-process (the app `gpufleet up` serves, on the real PostgreSQL) and
timed by its own `Server-Timing` header: the median of 5 renders after a warm-up. Every
cluster's router and both gateways are one stand-in HTTP server answering `/metrics` with the
real router and gateway counters, so the Map and Deployments pages pay for their scrapes.
Targets: every page ≤ 100 ms on the demo fleet and ≤ 1,000 ms on the bench-size fleet.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, generate_latest
from sqlalchemy import select

from controlplane.api.app import create_app
from controlplane.db import models as m
from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.local.ports import free_port
from controlplane.local.postgres import EmbeddedPostgres
from controlplane.local.secrets import Secrets
from controlplane.local.up import FLEET, bootstrap, load_fleet
from controlplane.settings import Settings

PAGES = ["/", "/map", "/clusters", "/pools", "/deployments", "/deployments/{d}",
         "/placement", "/events", "/playground", "/tokens"]  # fmt: skip
RENDERS = 5
TERM = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC))


def seed_bench_fleet(url: str, pools: int = 2000, deployments: int = 1000, per: int = 10) -> str:
    """Bulk rows: 20 regions, 100 clusters of 20 pools, `deployments` × `per` replicas."""
    engine = make_engine(url)
    with transaction(make_session_factory(engine)) as s:
        provider = m.Provider(name="bench", kind="local", provider_class="neocloud")
        gpu = m.GpuType(name="H100-bench", memory_gib=80)
        s.add_all([provider, gpu])
        s.flush()
        regions = [
            m.Region(name=f"r{i}", provider_id=provider.id, code=f"r{i}", jurisdiction="US",
                     latitude=-60 + i * 6, longitude=-170 + i * 17)
            for i in range(20)
        ]  # fmt: skip
        s.add_all(regions)
        s.flush()
        rows = [
            m.Pool(name=f"pool-{i:04}", provider_id=provider.id, region_id=regions[i % 20].id,
                   gpu_type_id=gpu.id, purchase_type=("reserved", "on_demand", "spot")[i % 3],
                   gpus=64, gpus_per_instance=8, price_per_gpu_hour=Decimal("2.5"),
                   committed_gpus=64 if i % 3 == 0 else None, status={"held_gpus": 32},
                   term_start=TERM[0] if i % 3 == 0 else None,
                   term_end=TERM[1] if i % 3 == 0 else None,
                   quota_gpus=None if i % 3 == 0 else 64)
            for i in range(pools)
        ]  # fmt: skip
        s.add_all(rows)
        s.flush()
        clusters = [
            m.Cluster(name=f"c{i:03}", region_id=regions[i % 20].id, state="healthy",
                      pools=rows[i * 20 : (i + 1) * 20])
            for i in range(pools // 20)
        ]  # fmt: skip
        s.add_all(clusters)
        s.flush()
        for i in range(deployments):
            d = m.Deployment(name=f"dep-{i:04}", model_id="bench/model", engine_image="vllm",
                             gpus_per_replica=1, autoscaling={"min_replicas": 1, "max_replicas": per})  # fmt: skip
            s.add(d)
            s.flush()
            c = clusters[i % len(clusters)]
            s.add(m.Placement(deployment_id=d.id, cluster_id=c.id, pool_id=c.pools[0].id,
                              replicas=per, max_replicas=per))  # fmt: skip
            s.add_all(
                m.Replica(name=f"dep-{i:04}-{j}", deployment_id=d.id, cluster_id=c.id,
                          state="ready")
                for j in range(per)
            )  # fmt: skip
        s.add_all(
            m.Event(type="bench", object_kind="Cluster", object_name=f"c{i % 100:03}",
                    message=f"bench event {i}")
            for i in range(5000)
        )  # fmt: skip
    engine.dispose()
    return "dep-0000"


def metrics_text(clusters: list[str], deployments: list[str]) -> bytes:
    """What a router and a gateway expose, in one text: requests per deployment and plane."""
    r = CollectorRegistry()
    routed = Counter("gpufleet_router_requests", "", ["deployment", "code"], registry=r)
    sent = Counter("gpufleet_gateway_requests", "", ["deployment", "plane", "code"], registry=r)
    for i, d in enumerate(deployments):
        routed.labels(d, "200").inc(10 + i)
        sent.labels(d, clusters[i % len(clusters)], "200").inc(1 + i)
    return generate_latest(r)


def stand_in(body: bytes) -> ThreadingHTTPServer:
    """A router and gateway stand-in: GET /metrics answers `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def page_times(url: str, token: str, deployment: str) -> dict[str, float]:
    engine = make_engine(url)
    with transaction(make_session_factory(engine)) as s:
        clusters = list(s.scalars(select(m.Cluster.name)))
        deployments = list(s.scalars(select(m.Deployment.name).limit(50)))
        regions = list(s.scalars(select(m.Region.name).order_by(m.Region.name).limit(2)))
    engine.dispose()
    server = stand_in(metrics_text(clusters, deployments))
    try:
        return _page_times(url, token, deployment, clusters, regions, server.server_address[1])
    finally:
        server.shutdown()


def _page_times(
    url: str, token: str, deployment: str, clusters: list[str], regions: list[str], port: int
) -> dict[str, float]:
    base = f"http://127.0.0.1:{port}"
    settings = Settings(
        database_url=url,
        router_urls=dict.fromkeys(clusters, base),
        gateway_urls={f"gw{i}": {"url": base, "region": r} for i, r in enumerate(regions)},  # type: ignore[arg-type]
    )
    app = create_app(settings)
    out: dict[str, float] = {}
    with TestClient(app) as client:
        login = client.post("/login", data={"token": token}, follow_redirects=False)
        assert login.status_code == 303, ("login", login.status_code, login.text[:300])
        for path in [*PAGES, "/api/v1/pools?limit=50"]:
            target = path.format(d=deployment)
            headers = {"Authorization": f"Bearer {token}"} if target.startswith("/api") else {}
            times = []
            for _ in range(RENDERS + 1):
                answer = client.get(target, headers=headers, follow_redirects=False)
                assert answer.status_code == 200, (target, answer.status_code, answer.text[:300])
                if target.startswith("/api"):
                    times.append(answer.elapsed.total_seconds() * 1000)
                else:
                    times.append(float(answer.headers["server-timing"].split("dur=")[1]))
            out[path] = statistics.median(times[1:])
    return out


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-dash-"))
    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="gpufleet-bench-dash-pg-")), free_port())
    server.init()
    server.start()
    verdicts = []
    try:
        for name, bound in (("demo", 100.0), ("bench", 1000.0)):
            server.create_database(name)
            url = server.url(name)
            token = bootstrap(url)
            assert token
            if name == "demo":
                load_fleet(url, FLEET, Secrets(root / "secrets"))
                deployment = "triage-llm"
            else:
                deployment = seed_bench_fleet(url)
            times = page_times(url, token, deployment)
            peer = times.pop("/api/v1/pools?limit=50")
            for path, ms in times.items():
                print(f"{name:5} {path:20} {ms:7.1f} ms")
            worst = max(times, key=lambda p: times[p])
            print(f"{name:5} API list of 50 pools (peer, client-side): {peer:.1f} ms")
            verdicts.append((name, worst, times[worst], peer, bound))
    finally:
        server.destroy()
    ok = all(ms <= bound for _, _, ms, _, bound in verdicts)
    parts = [
        f"{name}: slowest page {path} {ms:.0f} ms (API list of 50 pools {peer:.0f} ms; "
        f"target ≤ {bound:.0f} ms)"
        for name, path, ms, peer, bound in verdicts
    ]
    print(f"dashboard page server time — {'; '.join(parts)} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
