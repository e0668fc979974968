"""What `up` says: which models each router serves, the settings a busy port can move, and
logs that grow with what changed, not with every poll."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controlplane.local import up
from controlplane.settings import Settings


class FakeSecrets:
    def clusters(self) -> dict[str, Path]:
        return {"use1-a": Path("a.json"), "euc1-a": Path("b.json")}


def make_routers(readings: list[dict[str, list[str]]]) -> up.RouterModels:
    routers = up.RouterModels(Settings(router_base_port=8100), "unused", FakeSecrets())  # type: ignore[arg-type]
    routers.read = lambda: readings.pop(0)  # type: ignore[method-assign]
    return routers


def test_each_router_line_names_its_models_or_says_none_yet():
    routers = make_routers([{"use1-a": ["chat-llm", "triage-llm"]}])
    lines = routers.lines()
    assert "http://127.0.0.1:8100/v1" in lines[0] and "serves no model yet" in lines[0]
    assert lines[1].endswith("http://127.0.0.1:8101/v1  serves chat-llm, triage-llm")


def test_a_placement_change_is_said_once_and_only_for_the_router_it_changed():
    routers = make_routers(
        [
            {},
            {"euc1-a": ["eu-assistant"]},
            {"euc1-a": ["eu-assistant"]},
            {"euc1-a": ["eu-assistant"], "use1-a": []},
            {},
        ]
    )
    routers.lines()
    said = routers.changes()
    assert said is not None and said.splitlines() == [
        up.router_line("euc1-a", 8100, ["eu-assistant"])
    ]
    assert routers.changes() is None  # nothing changed: nothing said
    assert routers.changes() is None  # an empty list is no model, as before
    assert routers.changes() == up.router_line("euc1-a", 8100, [])  # placed elsewhere now


def test_the_busy_port_hint_names_every_port_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(up, "port_is_free", lambda port: port != 8101)
    with pytest.raises(up.UpError) as busy:
        up.check_ports({"api": 8080, "router 1": 8101})
    message = str(busy.value)
    assert "router 1 port 8101" in message
    for setting in (
        "API",
        "POSTGRES",
        "NATS",
        "REDIS",
        "ROUTER_BASE",
        "GATEWAY_BASE",
        "METRICS_BASE",
    ):
        assert f"GPUFLEET_{setting}_PORT" in message


def test_beat_does_not_log_every_due_task_and_the_worker_not_every_run():
    import controlplane.tasks as tasks

    beat = next(c for c in up.processes(Settings(), {}) if c.name == "beat")
    assert "--loglevel=WARNING" in beat.argv
    for name in tasks.PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    tasks.celery_app.log.setup_logging_subsystem(loglevel=logging.INFO)  # sends the signal
    for name in tasks.PER_TASK_LOGGERS:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.ERROR), name


def test_the_dashboard_port_setting_is_gone_until_there_is_a_dashboard():
    assert "dashboard_port" not in Settings.model_fields


def test_up_runs_two_gateways_and_the_routers_publish_their_load(tmp_path, monkeypatch):
    from controlplane.local.gateways import GATEWAYS

    monkeypatch.delenv("GPUFLEET_GATEWAY_BASE_PORT", raising=False)
    settings = Settings(data_dir=tmp_path)
    creds = tmp_path / "cluster-a.json"
    children = up.processes(settings, {"a": creds}, [(g, tmp_path / g.name) for g in GATEWAYS])
    router = next(c for c in children if c.name == "router-a")
    assert router.argv[-4:] == ["--cluster", "a", "--credentials-file", str(creds)]
    gateways = [c for c in children if c.name.startswith("gateway-")]
    assert [g.port for g in gateways] == [
        settings.router_base_port + 10,
        settings.router_base_port + 11,
    ]
    assert {g.argv[g.argv.index("--region") + 1] for g in gateways} == {
        "aws-us-east-1",
        "aws-eu-central-1",
    }
    said = up.gateway_lines(settings)
    assert len(said) == 2 and f":{settings.router_base_port + 10}/v1" in said[0]


def test_the_gateway_port_and_urls_are_settings(tmp_path, monkeypatch):
    from controlplane.local.gateways import gateway_base_port

    monkeypatch.setenv("GPUFLEET_GATEWAY_BASE_PORT", "9200")
    monkeypatch.setenv(
        "GPUFLEET_GATEWAY_URLS",
        '{"use1": {"url": "http://127.0.0.1:9200", "region": "aws-us-east-1"}}',
    )
    settings = Settings(data_dir=tmp_path)
    assert gateway_base_port(settings) == 9200
    assert settings.gateway_urls["use1"].region == "aws-us-east-1"
    monkeypatch.delenv("GPUFLEET_GATEWAY_BASE_PORT")
    assert gateway_base_port(Settings(data_dir=tmp_path)) == settings.router_base_port + 10
