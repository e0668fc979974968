"""Placement accounts for both revisions while a rollout runs (issue 18), and for a shadow:
the GPUs a lane or shadow runs beyond the deployment's placed replicas are held out of the
pool, priced on the deployment, bought where the pool has none free, and given back when
the rollout ends (controlplane/services/reservations.py).

The world is test_rollouts.py's: pool p1 shared by clusters a and b, deployment `chat`
placed 3 + 1 replicas of 1 GPU, here held at exactly 4 (min = max), the pool cut to 10 GPUs.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.integration.api import builders as b
from tests.integration.api.test_rollouts import PLACED, _entries, _new_revision, build_world

PRICE = Decimal("3.933750")
FOUR = {"min_replicas": 4, "max_replicas": 4}


def _world(admin: Any, factory: sessionmaker[Session], pool: dict[str, int], **spec: Any) -> Any:
    build_world(admin, factory, b.deployment("chat", autoscaling=FOUR, **spec), PLACED)
    patched = admin.patch("pools/p1", pool)
    assert patched.status_code == 200, patched.text
    return admin


def _replan(api: Any) -> dict[str, Any]:
    response = api.post("placement/replan", {})
    assert response.status_code == 200, response.text
    return response.json()


def _placement(api: Any, name: str) -> dict[str, Any]:
    return api.get(f"deployments/{name}").json()["status"]["placement"]


def _batch(api: Any, replicas: int) -> None:
    body = b.deployment("batch", autoscaling={"min_replicas": replicas, "max_replicas": replicas})
    response = api.post("deployments", body)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("rollout", "reserved"),
    [
        # the whole second copy: 3 on a, 1 on b
        ({"strategy": "blue_green", "keep_seconds": 600}, {"a": 3, "b": 1}),
        # the first step (5 %) pre-scales one replica per cluster, the stable side keeps all
        ({"strategy": "canary"}, {"a": 1, "b": 1}),
    ],
)
def test_a_rollouts_extra_replicas_are_held_priced_and_given_back(
    admin, session_factory, rollout, reserved
):
    api = _world(admin, session_factory, {"gpus": 10, "quota_gpus": 10}, rollout=rollout)
    _replan(api)
    assert _placement(api, "chat")["reserved_gpus"] == 0
    _new_revision(api)
    _replan(api)

    chat = _placement(api, "chat")
    assert chat["placed_replicas"] == 4
    held = {r["cluster"]: r["gpus"] for r in chat["reserved"]}
    assert held == reserved and chat["reserved_gpus"] == sum(reserved.values())
    assert {r["pool"] for r in chat["reserved"]} == {"p1"}
    assert all(r["reason"] == f"rollout chat--r2 ({rollout['strategy']})" for r in chat["reserved"])
    assert Decimal(chat["cost_per_hour"]) == (4 + sum(reserved.values())) * PRICE
    # the lanes the planes are told to run fit in what placement holds
    lanes = sum(_entries(session_factory, c)["chat--r2"].quota.max for c in PLACED)
    stable = sum(_entries(session_factory, c)["chat"].quota.max for c in PLACED)
    assert lanes + stable == 4 + sum(reserved.values())

    # another deployment gets only what is left of the 10 GPUs, and is told why
    _batch(api, 4)
    _replan(api)
    left = 10 - 4 - sum(reserved.values())
    batch = _placement(api, "batch")
    assert batch["placed_replicas"] == left
    assert sum(u["replicas"] for u in batch["unplaced"]) == 4 - left

    # the rollout over, the GPUs are given back
    assert api.post("deployments/chat/rollout/rollback", {}).status_code == 200
    _replan(api)
    assert _placement(api, "chat")["reserved_gpus"] == 0
    assert _placement(api, "batch")["placed_replicas"] == 4


def test_reserved_gpus_a_pool_has_not_got_are_bought(admin, session_factory):
    """A blue-green copy on a full pool with quota left: procurement holds instances for it
    (and for what the engine places beside it)."""
    api = _world(
        admin,
        session_factory,
        {"gpus": 4, "quota_gpus": 16},
        rollout={"strategy": "blue_green", "keep_seconds": 600},
    )
    _replan(api)
    assert api.get("instances").json()["items"] == []  # 4 of 4 GPUs used: nothing to buy
    _new_revision(api)
    summary = _replan(api)
    assert summary["deployments"]["chat"]["reserved_gpus"] == 4
    instances = api.get("instances").json()["items"]  # whole instances of 8 GPUs
    assert [i["state"] for i in instances] == ["requested"] and instances[0]["gpus"] >= 4


def test_a_shadow_is_held_on_every_cluster_the_deployment_runs_on(admin, session_factory):
    api = _world(
        admin,
        session_factory,
        {"gpus": 10, "quota_gpus": 10},
        shadow={"share": 0.1, "replicas": 2, "engine_image": "vllm/vllm-openai:v0.33.0"},
    )
    _replan(api)
    chat = _placement(api, "chat")
    assert {r["cluster"]: (r["gpus"], r["reason"]) for r in chat["reserved"]} == {
        "a": (2, "shadow"),
        "b": (2, "shadow"),
    }
    _batch(api, 4)
    _replan(api)
    assert _placement(api, "batch")["placed_replicas"] == 2  # 10 - 4 - 2 x 2
