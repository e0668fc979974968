"""The API's /metrics: every request counted by route template and code, timed, with no
name from a URL in a label (docs/observability.md). No database: a request that needs one
gets the API's 503, which is counted like any other answer."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from controlplane.api.app import create_app
from controlplane.api.auth import Principal
from controlplane.errors import Unauthenticated
from controlplane.local.ports import free_port
from controlplane.settings import Settings
from controlplane.specs import Role


class Viewer:
    """The token check without a database: any bearer token is a viewer's."""

    def verify(self, header: str | None) -> Principal:
        if not header:
            raise Unauthenticated("send Authorization: Bearer <token>")
        return Principal(token_id="t", name="prometheus", role=Role.viewer)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_requests_are_counted_by_route_template_and_code_and_timed() -> None:
    nowhere = f"postgresql+psycopg://gpufleet@127.0.0.1:{free_port()}/none"
    app = create_app(Settings(database_url=nowhere))
    app.state.verifier = Viewer()
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/metrics").status_code == 401  # figures of the fleet: a token
        assert client.get("/healthz").status_code == 200
        assert client.get("/healthz").status_code == 200
        assert client.get("/no/such/page-secret-name").status_code == 404
        token = {"Authorization": "Bearer gpf_x"}
        assert client.get("/api/v1/pools/pool-secret-name", headers=token).status_code == 503
        answer = client.get("/metrics", headers=token)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    got = samples(answer.text)
    count = "gpufleet_api_requests_total"
    assert got[(count, frozenset({("method", "GET"), ("route", "/healthz"), ("code", "200")}))] == 2
    assert (
        got[(count, frozenset({("method", "GET"), ("route", "unmatched"), ("code", "404")}))] == 1
    )
    pools = frozenset({("method", "GET"), ("route", "/api/v1/pools/{ref}"), ("code", "503")})
    assert got[(count, pools)] == 1
    histogram = (
        "gpufleet_api_request_duration_seconds_count",
        frozenset({("method", "GET"), ("route", "/healthz")}),
    )
    assert got[histogram] == 2
    assert "secret-name" not in answer.text
    assert got[("gpufleet_api_requests_in_flight", frozenset())] == 1  # the /metrics request
    # no database: the fleet's gauges are absent and say why, never zeros of an empty fleet
    assert got[("gpufleet_fleet_state_readable", frozenset())] == 0
    assert not any(name.startswith("gpufleet_cluster_") for name, _ in got)


def test_a_heartbeats_age_counts_up_to_what_the_bus_has_read():
    """A frozen bus process aged every cluster's heartbeat and paged once per cluster
    (GpufleetHeartbeatLost: "its agent or its network to NATS is down"); the age stops at
    the evidence horizon, and the bus's own lag is one gauge (GpufleetBusBehind)."""
    from datetime import UTC, datetime, timedelta

    from controlplane.api.fleetmetrics import cluster_metrics
    from controlplane.services.fleet_view import ClusterView

    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    beat = now - timedelta(minutes=5)  # the last heartbeat read, five minutes ago ...
    horizon = now - timedelta(minutes=5, seconds=-2)  # ... when the bus froze
    view = ClusterView("use1-a", "r", 0, 0, "healthy", False, None, beat, 1, 1, None, 8, {}, {})
    families = {f.name: f for f in cluster_metrics([view], now, horizon)}
    (age,) = families["gpufleet_cluster_heartbeat_age_seconds"].samples
    (lag,) = families["gpufleet_bus_evidence_lag_seconds"].samples
    assert age.value == 2.0 and lag.value == 298.0
