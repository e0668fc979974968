"""`gpufleet shadow report` against a live API: no shadow, then a shadow with reports from
two planes, shown side by side with the live deployment."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from controlplane.services import inventory
from controlplane.services.resources import KINDS
from tests.integration.api import builders as b
from tests.integration.api.test_rollouts import PLACED, _place
from tests.integration.api.test_shadows import SHADOW, _counters, _heartbeat
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
            ("deployments", b.deployment("chat")),
        ):
            kind = KINDS[path]
            inventory.create(s, kind, inventory.parse_spec(kind, body), ACTOR)
    _place(factory, "chat", PLACED)


def test_shadow_report_shows_live_and_shadow_side_by_side(cli: Cli, session_factory) -> None:
    _world(session_factory)
    none = cli("shadow", "report", "chat")
    assert none.exit_code == 1 and "has no shadow" in none.output
    missing = cli("shadow", "report", "nope")
    assert missing.exit_code == 1 and "does not exist" in missing.output

    with session_factory() as s, s.begin():
        inventory.patch(s, KINDS["deployments"], "chat", {"shadow": SHADOW}, ACTOR)
    _heartbeat(session_factory, "a", _counters(100), _counters(25, errors=5, slow=True, dropped=3))
    shown = cli("shadow", "report", "chat")
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "chat (shadow lane chat--shadow)" in out
    assert "25% of the requests copied, 2 replica(s) per cluster" in out
    assert "engine_image=vllm/vllm-openai:v0.33.0" in out and "Clusters:    a\n" in out
    rows = {line[:16].strip(): line[16:].split() for line in out.splitlines()[6:]}
    assert rows["Requests"] == ["100", "25"]
    assert rows["Error rate"] == ["0.0%", "20.0%"]
    assert rows["p99 TTFT"] == ["0.250s", "5.000s"]
    assert rows["Dropped"] == ["-", "3"]
    described = cli("describe", "deployment", "chat")
    assert described.exit_code == 0, described.output
    shadow = described.output.split("\nShadow:\n", 1)[1].split("\nEvents:")[0]
    assert "  Deployment:  chat (shadow lane chat--shadow)" in shadow
    assert "  Requests" in shadow and shadow.count("\n") >= 9


def test_describe_leaves_the_shadow_out_of_a_deployment_without_one(cli: Cli, session_factory):
    _world(session_factory)
    described = cli("describe", "deployment", "chat")
    assert described.exit_code == 0, described.output
    assert "\nShadow:" not in described.output and "\nEvents:" in described.output
