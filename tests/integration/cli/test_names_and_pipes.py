"""What the tables show is what the commands take, and piped tables stay one row per line."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_story import FLEET

LONG = "triage-llm-1-13478-1-with-a-name-long-enough-to-wrap-an-eighty-column-table"


def _fleet_with_a_replica(cli: Cli, tmp_path: Path, factory: sessionmaker[Session]) -> str:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    assert cli("apply", "-f", str(fleet), "--yes").exit_code == 0
    with factory() as s, s.begin():
        pool = s.query(m.Pool).one()
        cluster = s.query(m.Cluster).one()
        instance = m.Instance(
            pool_id=pool.id, cluster_id=cluster.id, idempotency_key="k", gpus=8, state="running"
        )
        s.add(instance)
        s.flush()
        s.add(
            m.Replica(
                name=LONG,
                deployment_id=s.query(m.Deployment).one().id,
                cluster_id=cluster.id,
                instance_id=instance.id,
                state="ready",
            )
        )
        return instance.id


def test_describe_takes_the_names_get_shows(
    cli: Cli, tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    instance_id = _fleet_with_a_replica(cli, tmp_path, session_factory)
    listed = cli("get", "replicas")
    assert listed.exit_code == 0, listed.output
    shown = listed.output.splitlines()[1].split()[0]
    assert shown == LONG
    described = cli("describe", "replica", shown)
    assert described.exit_code == 0, described.output
    assert f"name: {LONG}" in described.output
    short_id = cli("get", "instances").output.splitlines()[1].split()[0]
    assert instance_id.startswith(short_id)
    described = cli("describe", "instance", short_id)
    assert described.exit_code == 0 and f"id: {instance_id}" in described.output


def test_a_piped_table_never_wraps_whatever_columns_says(
    cli: Cli, tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    _fleet_with_a_replica(cli, tmp_path, session_factory)
    for columns in (None, "40"):
        cli.env["COLUMNS"] = columns
        lines = cli("get", "replicas", "-o", "wide").output.splitlines()
        assert len(lines) == 2, lines  # the header and one row: nothing folded
        assert lines[1].split()[0] == LONG


def test_a_limit_of_zero_is_a_usage_error_like_the_api_422(cli: Cli) -> None:
    result = cli("get", "events", "--limit", "0")
    assert result.exit_code == 2
    assert "--limit" in result.output


def test_the_delete_hint_names_the_cli_flag(
    cli: Cli, tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    _fleet_with_a_replica(cli, tmp_path, session_factory)
    refused = cli("delete", "deployment", "chat-llm")
    assert refused.exit_code == 1
    assert "--force" in refused.output and "?force=true" not in refused.output
    assert cli("delete", "deployment", "chat-llm", "--force").exit_code == 0
