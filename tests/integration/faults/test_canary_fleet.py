"""Issue 18 through the whole local fleet (`gpufleet up`: API, PostgreSQL, Celery's 5 s
rollout tick, NATS, agents, routers, engine-sim replicas): a canary of a deliberately bad
revision (engine-sim `--error-rate 0.5`) stops at its first gate and rolls back with a few
user-visible errors and none after; a good revision goes 50 % → 100 % and is promoted with
no error, its lane's replicas joining the deployment as they are."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.integration.faults.conftest import CLUSTERS, Fleet
from tests.integration.test_up import _wait_until

DEPLOYMENT = "eu-assistant"
SERVER_FIELDS = {"kind", "id", "generation", "status", "created_at", "updated_at"}
CANARY = {"strategy": "canary", "steps": [0.5, 1.0], "hold_seconds": 2,
          "gates": {"min_requests": 20}}  # fmt: skip


class Traffic:
    """Closed-loop requests to one router, each from its own `user` (the split is sticky per
    user): (time, status) of every answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2, "user": f"u{n}"}  # fmt: skip
                try:
                    status = client.post("/v1/chat/completions", json=body).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic(), status))

    def errors(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for t, s in self.answers if since <= t < until and s != 200)

    def answered_since(self, since: float) -> int:
        return sum(1 for t, _ in self.answers if t >= since)

    @contextmanager
    def running(self) -> Iterator[Traffic]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(30)


def _rollout(fleet: Fleet) -> dict:
    answer = fleet.api.get(f"/api/v1/deployments/{DEPLOYMENT}/rollout")
    assert answer.status_code == 200, answer.text
    return answer.json()


def _wait_phase(fleet: Fleet, to_revision: int, phase: str, timeout_s: float) -> dict:
    seen: list[dict] = []

    def there() -> bool:
        seen[:] = [_rollout(fleet)]
        return seen[0]["to_revision"] == to_revision and seen[0]["phase"] == phase

    try:
        _wait_until(there, timeout_s, f"the rollout to revision {to_revision} to be {phase}")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; last seen: {seen[0] if seen else None}") from None
    return seen[0]


def _revise(fleet: Fleet, engine_args: list[str]) -> int:
    answer = fleet.api.patch(f"/api/v1/deployments/{DEPLOYMENT}", json={"engine_args": engine_args})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["status"]["revision"])


def _restore(fleet: Fleet, original: dict) -> None:
    """Put the deployment back as it was, its revision fields at once (`immediate`, or the
    default canary would start one more rollout), then its own rollout spec."""
    path = f"/api/v1/deployments/{DEPLOYMENT}"
    for body in ({**original, "rollout": {"strategy": "immediate"}}, original):
        restored = fleet.api.put(path, json=body)
        assert restored.status_code in (200, 201), restored.text
    revision = str(restored.json()["status"]["revision"])

    def settled() -> bool:
        """Every replica of the deployment on every plane is of the restored revision and
        ready, and no lane is left: the next test finds the fleet as the suite started it
        (a replica still being replaced would look like one a fault stopped)."""
        for cluster in CLUSTERS:
            record = fleet.up.data_dir / "agents" / cluster / "runtime" / "replicas.json"
            rows = json.loads(record.read_text()) if record.exists() else []
            for r in rows:
                if DEPLOYMENT not in (r.get("deployment"), r.get("serves")):
                    continue
                if r.get("deployment") != DEPLOYMENT or r.get("state") != "ready":
                    return False
                if str(r.get("spec", {}).get("revision")) != revision:
                    return False
        return True

    _wait_until(settled, 120, f"{DEPLOYMENT} to settle at revision {revision}, no lane left")


def _replicas_text(fleet: Fleet, cluster: str) -> str:
    return (fleet.up.data_dir / "agents" / cluster / "runtime" / "replicas.json").read_text()


def test_a_bad_canary_rolls_back_at_its_first_gate_and_a_good_one_is_promoted(fleet: Fleet):
    cluster = fleet.serving(DEPLOYMENT)
    spec = fleet.api.get(f"/api/v1/deployments/{DEPLOYMENT}").json()
    original = {k: v for k, v in spec.items() if k not in SERVER_FIELDS}
    changed = fleet.api.patch(f"/api/v1/deployments/{DEPLOYMENT}", json={"rollout": CANARY})
    assert changed.status_code == 200, changed.text
    try:
        with Traffic(fleet.router(cluster)).running() as traffic:
            _wait_until(lambda: traffic.answered_since(0) >= 20, 30, "traffic to flow")
            began = time.monotonic()
            bad = _revise(fleet, [*original.get("engine_args", []), "--error-rate", "0.5"])
            rolled = _wait_phase(fleet, bad, "rolled_back", 120)
            back = time.monotonic()
            assert "gate failed" in rolled["reason"], rolled
            # some users saw the bad revision's errors (that is how the gate knew), and no
            # more once the lane is gone from the plane
            assert traffic.errors(since=began) > 0
            _wait_until(lambda: f"{DEPLOYMENT}--r{bad}" not in _replicas_text(fleet, cluster),
                        60, "the bad lane to drain")  # fmt: skip
            drained = time.monotonic()
            _wait_until(lambda: traffic.answered_since(drained) >= 40, 60, "more traffic")
            assert traffic.errors(since=drained) == 0
            good_began = time.monotonic()
            good = _revise(fleet, [*original.get("engine_args", []), "--tokens-per-s", "300"])
            promoted = _wait_phase(fleet, good, "promoted", 180)
            assert promoted["share"] == 1.0
            assert traffic.errors(since=good_began) == 0
            print(f"bad canary rolled back {back - began:.1f}s after the change with "
                  f"{traffic.errors(since=began, until=drained)} user-visible errors; good one "
                  f"promoted after {time.monotonic() - good_began:.1f}s, 0 errors")  # fmt: skip
    finally:
        _restore(fleet, original)
    fleet.serving(DEPLOYMENT)
