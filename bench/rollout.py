"""Rollout bench (issue 18): a canary next to blue-green on the whole local fleet, same run.

`gpufleet up` (API, PostgreSQL, Celery's 5 s rollout tick, NATS, agents, routers, engine-sim
replicas); the demo deployment ``eu-assistant`` is set to 4 replicas of 1 GPU and served
under closed-loop traffic (each request from a new ``user``: the split is sticky per user)
to its plane's router. Three rollouts, each a change of the engine args (a new revision):

1. a **bad** revision (engine-sim ``--error-rate 0.5``) under ``canary``: seconds from the
   change to ``rolled_back``, errors users saw before it, and errors once the lane is gone;
2. a **good** revision under ``canary``: seconds to ``promoted``, errors users saw;
3. a good revision under ``blue_green``: seconds to ``promoted``, errors users saw.

Like with like: the canary's steps are 25 % → 50 % → 100 %, held ``HOLD`` s each; blue-green
keeps the old revision ``3 × HOLD`` s, as long as the canary judges the new one. Extra GPU-
hours: GPUs of the deployment's replicas on the planes (every revision, lanes included,
from the agents' own records, sampled every 0.2 s) above its 4, integrated from the change
until the rollout is done and the replicas are back to 4.

Target: the good canary and blue-green with 0 user errors, the bad canary rolled back with
0 errors once its lane is gone, and the canary's extra GPU-hours ≤ 0.5 × blue-green's. The
last line is the headline (PASS/FAIL), the exit status non-zero on FAIL. ~4 minutes.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.support.headline import finish
from bench.support.upfleet import UpFleet, up_fleet, wait_until

DEPLOYMENT = "eu-assistant"
SIZE, GPUS = 4, 1
HOLD = 5.0
GATES = {"min_requests": 20}
CANARY = {"strategy": "canary", "steps": [0.25, 0.5, 1.0], "hold_seconds": HOLD, "gates": GATES}
BLUE_GREEN = {"strategy": "blue_green", "keep_seconds": 3 * HOLD, "gates": GATES}
TARGET_RATIO = 0.5


class Traffic:
    """Closed-loop requests to one router, each from its own ``user``: (time, status)."""

    def __init__(self, url: str, workers: int = 2) -> None:
        self.url = url
        self.answers: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True)
                         for w in range(workers)]  # fmt: skip

    def _run(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2, "user": f"w{worker}-u{n}"}  # fmt: skip
                try:
                    status = client.post("/v1/chat/completions", json=body).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic(), status))

    def errors(self, since: float, until: float = float("inf")) -> int:
        return sum(1 for t, s in self.answers if since <= t < until and s != 200)

    def answered(self, since: float) -> int:
        return sum(1 for t, _ in self.answers if t >= since)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


@dataclass
class Run:
    label: str
    phase: str
    decided_s: float
    settled_s: float
    errors_before: int
    errors_after: int
    extra_gpu_s: float
    reason: str


def gpus_now(fleet: UpFleet, cluster: str) -> int:
    """GPUs the deployment's replicas hold on the plane (every revision, lanes too)."""
    return sum(
        len(r.get("gpus") or [])
        for r in fleet.replicas(cluster)
        if r.get("pid") is not None
        and r.get("state") in ("starting", "ready", "draining")
        and DEPLOYMENT in (r.get("deployment"), r.get("serves"))
    )


def patch(fleet: UpFleet, body: dict) -> dict:
    answer = fleet.api.patch(f"/api/v1/deployments/{DEPLOYMENT}", json=body)
    if answer.status_code != 200:
        raise RuntimeError(f"PATCH {body}: {answer.status_code} {answer.text}")
    return answer.json()


def rollout(fleet: UpFleet) -> dict:
    answer = fleet.api.get(f"/api/v1/deployments/{DEPLOYMENT}/rollout")
    return answer.json() if answer.status_code == 200 else {}


def measure(
    fleet: UpFleet, cluster: str, traffic: Traffic, label: str, policy: dict, args: list[str]
) -> Run:
    patch(fleet, {"rollout": policy})  # not a revision of its own
    began = time.monotonic()
    revision = int(patch(fleet, {"engine_args": args})["status"]["revision"])
    extra, last, decided, seen = 0.0, began, None, {}
    deadline = began + 240
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = time.monotonic()
        extra += max(0, gpus_now(fleet, cluster) - SIZE * GPUS) * (now - last)
        last = now
        seen = rollout(fleet)
        if decided is None and seen.get("to_revision") == revision and seen.get("finished_at"):
            decided = now
        if decided is not None and gpus_now(fleet, cluster) == SIZE * GPUS:
            lanes = [r for r in fleet.replicas(cluster) if r.get("serves") == DEPLOYMENT
                     and r.get("deployment") != DEPLOYMENT]  # fmt: skip
            if not lanes:
                break
    else:
        raise RuntimeError(f"{label}: not done in 240 s; rollout: {seen}")
    settled = time.monotonic()
    assert decided is not None
    wait_until(lambda: traffic.answered(settled) >= 40, 60, "traffic after the rollout")
    return Run(
        label,
        str(seen.get("phase")),
        decided - began,
        settled - began,
        traffic.errors(began, settled),
        traffic.errors(settled),
        extra,
        str(seen.get("reason", "")),
    )


def main() -> int:
    with up_fleet() as fleet:
        cluster = fleet.serving(DEPLOYMENT)
        spec = fleet.api.get(f"/api/v1/deployments/{DEPLOYMENT}").json()
        base_args = [a for a in spec.get("engine_args", [])]
        patch(fleet, {"rollout": {"strategy": "immediate"}})
        patch(fleet, {"gpus_per_replica": GPUS, "autoscaling": {
            "min_replicas": SIZE, "max_replicas": SIZE, "target_concurrency": 32}})  # fmt: skip
        cluster = fleet.serving(DEPLOYMENT)

        def settled() -> bool:
            ready = [r for r in fleet.replicas(cluster)
                     if r.get("deployment") == DEPLOYMENT and r.get("state") == "ready"]  # fmt: skip
            return len(ready) == SIZE and gpus_now(fleet, cluster) == SIZE * GPUS

        wait_until(settled, 180, f"{SIZE} ready replicas of {DEPLOYMENT}")
        traffic = Traffic(fleet.router(cluster))
        traffic.start()
        try:
            wait_until(lambda: traffic.answered(0) >= 50, 60, "traffic to flow")
            runs = [
                measure(fleet, cluster, traffic, "bad canary", CANARY,
                        [*base_args, "--error-rate", "0.5"]),
                measure(fleet, cluster, traffic, "good canary", CANARY,
                        [*base_args, "--tokens-per-s", "300"]),
                measure(fleet, cluster, traffic, "blue-green", BLUE_GREEN,
                        [*base_args, "--tokens-per-s", "250"]),
            ]  # fmt: skip
        finally:
            traffic.stop()
    print(f"{'rollout':<12} {'phase':<12} {'decided s':>9} {'settled s':>9} {'errors':>7} "
          f"{'after':>6} {'extra GPU-h':>11}  reason")  # fmt: skip
    for r in runs:
        print(f"{r.label:<12} {r.phase:<12} {r.decided_s:>9.1f} {r.settled_s:>9.1f} "
              f"{r.errors_before:>7} {r.errors_after:>6} {r.extra_gpu_s / 3600:>11.4f}  "
              f"{r.reason}")  # fmt: skip
    bad, good, bg = runs
    ratio = good.extra_gpu_s / bg.extra_gpu_s if bg.extra_gpu_s else float("inf")
    ok = (
        bad.phase == "rolled_back"
        and bad.errors_after == 0
        and good.phase == "promoted"
        and good.errors_before + good.errors_after == 0
        and bg.phase == "promoted"
        and bg.errors_before + bg.errors_after == 0
        and ratio <= TARGET_RATIO
    )
    return finish(
        f"rollout: bad canary {bad.phase} in {bad.decided_s:.1f} s ({bad.errors_before} user "
        f"errors, {bad.errors_after} after), good canary {good.phase} in {good.decided_s:.1f} s "
        f"({good.errors_before + good.errors_after} errors), good blue-green {bg.phase} in "
        f"{bg.decided_s:.1f} s ({bg.errors_before + bg.errors_after} errors); canary extra "
        f"GPU-h {good.extra_gpu_s / 3600:.4f} vs blue-green {bg.extra_gpu_s / 3600:.4f} "
        f"({ratio:.2f}x) — target the bad one rolled back, the good ones promoted, 0 errors "
        f"(bad: 0 after its rollback), canary ≤ {TARGET_RATIO}x blue-green's extra GPU-h:",
        ok,
    )


if __name__ == "__main__":
    sys.exit(main())
