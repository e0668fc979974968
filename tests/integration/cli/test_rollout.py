"""`gpufleet rollout …` and `describe deployment` against a live API: a canary started by a
revision change, looked at, paused, rolled back."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from controlplane.services import inventory
from controlplane.services.resources import KINDS
from tests.integration.api import builders as b
from tests.integration.api.test_rollouts import CANARY, PLACED, _place
from tests.integration.cli.conftest import Cli

ACTOR = inventory.Actor("test")


def _world(factory: sessionmaker[Session]) -> None:
    with factory() as s, s.begin():
        for path, body in (
            ("providers", b.provider()),
            ("regions", b.region()),
            ("gpu-types", b.gpu_type()),
            ("pools", b.pool("p1")),
            ("clusters", b.cluster("a", pools=["p1"])),
            ("clusters", b.cluster("b", pools=["p1"])),
            ("deployments", b.deployment("chat", rollout=CANARY)),
        ):
            kind = KINDS[path]
            inventory.create(s, kind, inventory.parse_spec(kind, body), ACTOR)
    _place(factory, "chat", PLACED)


def _new_revision(factory: sessionmaker[Session]) -> None:
    with factory() as s, s.begin():
        changes = {"engine_image": "vllm/vllm-openai:v0.33.0"}
        inventory.patch(s, KINDS["deployments"], "chat", changes, ACTOR)


def test_rollout_status_pause_rollback_and_describe(cli: Cli, session_factory) -> None:
    _world(session_factory)
    none = cli("rollout", "status", "chat")
    assert none.exit_code == 1 and "has had no rollout" in none.output
    _new_revision(session_factory)

    shown = cli("rollout", "status", "chat")
    assert shown.exit_code == 0, shown.output
    assert "1 (stable) → 2 (lane chat--r2)" in shown.output
    assert "Phase:       scaling" in shown.output and "Step:        1 of 2" in shown.output

    paused = cli("rollout", "pause", "chat")
    assert paused.exit_code == 0 and "paused (paused while scaling)" in paused.output
    again = cli("rollout", "pause", "chat")
    assert again.exit_code == 1 and "cannot pause" in again.output

    described = cli("describe", "deployment", "chat")
    assert described.exit_code == 0, described.output
    assert "Rollout:\n  Deployment:  chat" in described.output
    assert "RolloutPaused" in described.output

    rolled = cli("rollout", "rollback", "chat")
    assert rolled.exit_code == 0 and "rolled_back" in rolled.output
    assert "Share:       0%" in rolled.output
    done = cli("rollout", "promote", "chat")
    assert done.exit_code == 1 and "is done (rolled_back)" in done.output
    missing = cli("rollout", "status", "nope")
    assert missing.exit_code == 1 and "does not exist" in missing.output
