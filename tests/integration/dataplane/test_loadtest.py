"""`gpufleet loadtest` as a user runs it (the real command, a subprocess) against a plane's
router over engine-sim replicas (docs/loadtest.md)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.dataplane.conftest import Plane, make_sim_deployment
from workloadplane.loadtest.profiles import ABNORMAL
from workloadplane.runtime.process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def loadtest(*args: str) -> tuple[int, str]:
    """Run the command without blocking this loop (the router under test runs in it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpufleet_cli", "loadtest", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    return proc.returncode or 0, out.decode()


async def test_steady_load_reports_latency_tokens_and_a_chart(sim_plane: Plane, tmp_path: Path):
    await sim_plane.apply(make_sim_deployment(replicas=2))
    await sim_plane.wait_ready("chat", 2)
    report, page = tmp_path / "run.json", tmp_path / "run.html"
    rc, out = await loadtest(
        "chat", "--url", sim_plane.url, "--rate", "15", "--duration", "3",
        "--max-tokens", "12", "--json", str(report), "--html", str(page),
    )  # fmt: skip
    assert rc == 0, out
    assert "PASS" in out and "TTFT ms" in out
    doc = json.loads(report.read_text())
    summary, outcomes = doc["summary"], doc["outcomes"]
    assert summary["passed"] and summary["normal"] == summary["ok"] == len(outcomes) == 45
    assert {o["stream"] for o in outcomes} == {True, False}
    assert all(o["status"] == 200 and o["tokens"] == 12 for o in outcomes)
    assert summary["ttft_ms"]["p50"] < summary["e2e_ms"]["p50"]  # streams: first token early
    assert summary["tokens"] == 45 * 12
    assert page.read_text().count("<svg") == 2


async def test_abnormal_requests_get_4xx_and_the_plane_keeps_serving(
    sim_plane: Plane, tmp_path: Path
):
    await sim_plane.apply(make_sim_deployment(replicas=1))
    await sim_plane.wait_ready("chat", 1)
    report = tmp_path / "abnormal.json"
    rc, out = await loadtest(
        "chat", "--url", sim_plane.url, "--profile", "abnormal", "--rate", "14",
        "--duration", "2", "--max-tokens", "8", "--json", str(report),
    )  # fmt: skip
    assert rc == 0, out
    outcomes = json.loads(report.read_text())["outcomes"]
    abnormal = {o["kind"]: o for o in outcomes if o["kind"] != "normal"}
    assert set(abnormal) == set(ABNORMAL), sorted(abnormal)
    for kind, o in abnormal.items():
        if kind == "client_goes_away":
            assert o["status"] == 200 and o["error"] == "client went away"
        else:
            assert 400 <= o["status"] < 500, o
    assert all(o["ok"] for o in outcomes if o["kind"] == "normal")
    async with httpx.AsyncClient(timeout=10) as client:  # and it still serves
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = await client.post(f"{sim_plane.url}/v1/chat/completions", json=body)
        assert answer.status_code == 200


async def test_an_endpoint_that_is_down_fails_the_run_and_says_why() -> None:
    rc, out = await loadtest(
        "chat", "--url", f"http://127.0.0.1:{free_port()}", "--rate", "5", "--duration", "1"
    )
    assert rc == 1, out
    assert "connection refused" in out and "FAIL: 5 normal request(s) failed" in out
