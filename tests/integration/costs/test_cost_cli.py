"""`gpufleet cost` end to end: the CLI against a live API (uvicorn) over the real PostgreSQL,
with a ledger accrued by the service with an injected clock."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.cli.conftest import Cli, api_url  # noqa: F401  (fixture)
from tests.integration.costs.test_costs_api import WINDOW

ARGS = ("--from", WINDOW["from"], "--to", WINDOW["to"])


@pytest.fixture
def cli(api_url: str, tokens: dict[str, str], tmp_path: Path) -> Cli:  # noqa: F811
    return Cli(api_url, tokens["viewer"], tmp_path / "config.yaml")


def test_cost_prints_the_groups_reservations_tokens_and_tco(cli, ledger):
    result = cli("cost", *ARGS)
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"chat-llm\s+\$16\.00\s+25%", out), out
    assert re.search(r"\(idle\)\s+\$48\.00\s+75%", out), out
    assert re.search(r"total\s+\$64\.00\s+100%\s+24\.0\s+8\.0\s+16\.0", out), out
    assert re.search(r"rsv\s+16\s+2026-06-20", out), out
    assert re.search(
        r"chat-llm\s+3,000,000\s+1,000,000\s+\$16\.00\s+\$4\.0000\s+hosted-llama-8b", out
    )
    assert "gpu reserved" in out
    assert "data transfer" in out
    assert "0 until the egress price is set" in out
    assert "Moving work onto idle reservations" in out
    assert re.search(r"\$0\.00\s+\$0\.00\s+\$0\.00\s+8 -> 8\s+0\s+0 -> 0", out), out


def test_cost_by_purchase_type(cli, ledger):
    result = cli("cost", "--by", "purchase-type", *ARGS)
    assert result.exit_code == 0, result.output
    assert re.search(r"reserved\s+\$32\.00\s+50%", result.output), result.output
    assert re.search(r"on_demand\s+\$32\.00\s+50%", result.output), result.output


def test_cost_writes_a_self_contained_html_report(cli, ledger, tmp_path):
    page = tmp_path / "cost.html"
    result = cli("cost", "--by", "provider", "--html", str(page), *ARGS)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert text.startswith("<!doctype html>")
    assert "<svg" in text and "<rect" in text
    assert "aws-main: $64.00" in text  # the day's bar, stacked by provider
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert "break-even tokens" in text


def test_cost_as_json_is_the_api_answer(cli, ledger):
    result = cli("cost", "-o", "json", *ARGS)
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["total"]["cost"] == pytest.approx(64.0)


def test_cost_week_asks_for_seven_days(cli, ledger):
    result = cli("cost", "--week", "-o", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    span = datetime.fromisoformat(body["to"]) - datetime.fromisoformat(body["from"])
    assert abs(span - timedelta(days=7)) < timedelta(minutes=1)


def test_cost_bad_input_is_one_line_and_exit_2_or_1(cli, tokens):
    bad_by = cli("cost", "--by", "region")
    assert bad_by.exit_code == 2
    bad_time = cli("cost", "--from", "yesterday")
    assert bad_time.exit_code == 1
    assert "from: 'yesterday' is not a time" in bad_time.output
    both = cli("cost", "--week", "--from", "2026-01-01")
    assert both.exit_code == 2
    assert "give --week or --from, not both" in both.output
    anonymous = cli.as_token(None)("cost")
    assert anonymous.exit_code == 1
    assert "gpufleet login" in anonymous.output


def test_the_demo_api_prices_apply_and_list(api_url, tokens, tmp_path):  # noqa: F811
    admin = Cli(api_url, tokens["admin"], tmp_path / "admin.yaml")
    demo = Path(__file__).parents[3] / "infra" / "examples" / "api-prices.yaml"
    applied = admin("apply", "-y", "-f", str(demo))
    assert applied.exit_code == 0, applied.output
    listed = admin("get", "api-prices")
    assert re.search(
        r"together-llama-3-1-70b\s+meta-llama/Llama-3.1-70B-Instruct\s+0\.880000", listed.output
    ), listed.output
    again = admin("diff", "-f", str(demo))
    assert again.exit_code == 0, again.output
