"""Blue-green (issue 18) through the whole local fleet (`gpufleet up`: API, PostgreSQL,
Celery's 5 s rollout tick, NATS, agents, routers, engine-sim replicas): under steady load a
new revision comes up at full size beside the old one, takes every request at once when it
is ready, and a rollback during the keep window sends them back at once to the old
replicas, which never stopped; then a short keep window ends in a promotion. Users see no
error at any point."""

from __future__ import annotations

import json
import re
import time

import httpx

from tests.integration.faults.conftest import Fleet
from tests.integration.faults.test_canary_fleet import (
    DEPLOYMENT,
    SERVER_FIELDS,
    Traffic,
    _restore,
    _revise,
    _wait_phase,
)
from tests.integration.test_up import _wait_until

BLUE_GREEN = {"strategy": "blue_green", "keep_seconds": 600, "gates": {"min_requests": 20}}
SAMPLE = re.compile(r"^gpufleet_router_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def _served(fleet: Fleet, cluster: str) -> dict[str, int]:
    """Requests the cluster's router answered with a 200, per entry (stable or lane)."""
    text = httpx.get(fleet.router(cluster) + "/metrics", timeout=10).text
    out: dict[str, int] = {}
    for line in text.splitlines():
        found = SAMPLE.match(line)
        labels = dict(LABEL.findall(found["labels"])) if found else {}
        if labels.get("code") == "200":
            out[labels["deployment"]] = int(float(found["value"])) if found else 0
    return out


def _pids(fleet: Fleet, cluster: str, entry: str, revision: int | None = None) -> set[int]:
    """The processes of ``entry``'s replicas (of ``revision`` only, when given: a replica of
    an older one may still be draining from an earlier test)."""
    record = fleet.up.data_dir / "agents" / cluster / "runtime" / "replicas.json"
    return {
        int(r["pid"])
        for r in json.loads(record.read_text())
        if r["deployment"] == entry
        and r.get("pid")
        and (revision is None or r["spec"]["revision"] == str(revision))
    }


def _replicas(fleet: Fleet, cluster: str) -> list[tuple[str, str, str]]:
    record = fleet.up.data_dir / "agents" / cluster / "runtime" / "replicas.json"
    return [(r["replica_id"], r["deployment"], r["state"]) for r in json.loads(record.read_text())]


def _grows(fleet: Fleet, cluster: str, entry: str, by: int, timeout_s: float) -> float:
    """Seconds until ``entry``'s answered requests grew by ``by`` (polled every 50 ms)."""
    began, first = time.monotonic(), _served(fleet, cluster).get(entry, 0)
    while _served(fleet, cluster).get(entry, 0) < first + by:
        if time.monotonic() - began > timeout_s:
            raise AssertionError(
                f"{entry} served fewer than {by} requests in {timeout_s}s: "
                f"{_served(fleet, cluster)}; replicas: {_replicas(fleet, cluster)}; metrics: "
                + httpx.get(fleet.router(cluster) + "/metrics", timeout=10).text[-3000:]
            )
        time.sleep(0.05)
    return time.monotonic() - began


def test_blue_green_switches_at_once_and_rolls_back_at_once_with_no_error(fleet: Fleet):
    cluster = fleet.serving(DEPLOYMENT)
    spec = fleet.api.get(f"/api/v1/deployments/{DEPLOYMENT}").json()
    original = {k: v for k, v in spec.items() if k not in SERVER_FIELDS}
    args = original.get("engine_args", [])
    changed = fleet.api.patch(f"/api/v1/deployments/{DEPLOYMENT}", json={"rollout": BLUE_GREEN})
    assert changed.status_code == 200, changed.text
    try:
        with Traffic(fleet.router(cluster)).running() as traffic:
            _wait_until(lambda: traffic.answered_since(0) >= 20, 30, "traffic to flow")
            stable = int(spec["status"]["revision"])
            _wait_until(lambda: _pids(fleet, cluster, DEPLOYMENT) == _pids(fleet, cluster,
                        DEPLOYMENT, stable) != set(), 60, "the deployment to settle")  # fmt: skip
            stable_pids = _pids(fleet, cluster, DEPLOYMENT, stable)
            began = time.monotonic()
            new = _revise(fleet, [*args, "--tokens-per-s", "300"])
            lane = f"{DEPLOYMENT}--r{new}"
            keeping = _wait_phase(fleet, new, "keeping", 120)
            switch_s = time.monotonic() - began
            assert keeping["share"] == 1.0 and keeping["keep_until"] is not None

            # every request now goes to the new revision; the old one is idle, but up
            _grows(fleet, cluster, lane, 10, 30)
            idle_from = _served(fleet, cluster).get(DEPLOYMENT, 0)
            _grows(fleet, cluster, lane, 40, 30)
            assert _served(fleet, cluster).get(DEPLOYMENT, 0) == idle_from
            assert _pids(fleet, cluster, DEPLOYMENT, stable) == stable_pids

            clicked = time.monotonic()
            rolled = fleet.api.post(f"/api/v1/deployments/{DEPLOYMENT}/rollout/rollback")
            assert rolled.status_code == 200 and rolled.json()["phase"] == "rolled_back"
            _grows(fleet, cluster, DEPLOYMENT, 5, 10)
            back_s = time.monotonic() - clicked
            assert back_s < 5, f"traffic back on the old revision after {back_s:.1f}s"
            assert _pids(fleet, cluster, DEPLOYMENT, stable) == stable_pids  # nothing restarted
            after_back = time.monotonic()
            _wait_until(lambda: traffic.answered_since(after_back) >= 40, 30, "more traffic")
            assert traffic.errors(since=began) == 0

            # a short keep window: switched, then promoted; the lane's replicas join
            short = {**BLUE_GREEN, "keep_seconds": 3}
            shortened = fleet.api.patch(
                f"/api/v1/deployments/{DEPLOYMENT}", json={"rollout": short}
            )
            assert shortened.status_code == 200, shortened.text
            promoted_began = time.monotonic()
            good = _revise(fleet, [*args, "--tokens-per-s", "250"])
            _wait_phase(fleet, good, "keeping", 120)
            lane_pids = _pids(fleet, cluster, f"{DEPLOYMENT}--r{good}")
            promoted = _wait_phase(fleet, good, "promoted", 60)
            assert promoted["reason"].startswith("kept 3s")
            _wait_until(lambda: not _pids(fleet, cluster, f"{DEPLOYMENT}--r{good}"), 30,
                        "the lane's replicas to join the deployment")  # fmt: skip
            assert lane_pids <= _pids(fleet, cluster, DEPLOYMENT)  # adopted, not restarted
            settled = time.monotonic()
            _wait_until(lambda: traffic.answered_since(settled) >= 40, 30, "more traffic")
            assert traffic.errors(since=began) == 0
            print(f"blue-green switched {switch_s:.1f}s after the change; rolled back: traffic "
                  f"on the old replicas {back_s:.2f}s after the command; promoted "
                  f"{time.monotonic() - promoted_began:.1f}s after the next change; "
                  f"{len(traffic.answers)} requests, {traffic.errors()} errors")  # fmt: skip
    finally:
        _restore(fleet, original)
    fleet.serving(DEPLOYMENT)
