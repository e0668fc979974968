"""The data path's logs, end to end through real processes logging JSON at DEBUG: a gateway,
one plane's router and its engine-sim replica. The same X-Request-Id — the client's, or the
one the gateway made — is on a line of each hop; no line holds the prompt or the
completion; every line is one JSON object."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controlplane.contracts import DeploymentRoute, PlaneRoute, RoutingTable
from controlplane.local.ports import free_port
from tests.integration.gateway.conftest import PLANES, REGIONS, Fleet, wait_until

pytestmark = pytest.mark.integration

HOPS = ("g1", "router-a", "sim-a")
PROMPT = "PROMPT-zebra-quartz-1729: my card number is 4111 1111 1111 1111"


class LoggedPath(Fleet):
    """NATS, engine-sim ``sim-a`` behind router ``router-a``, gateway ``g1``; each process
    logs JSON at DEBUG into ``<name>.log``."""

    def spawn(self, name: str, argv: list[str]) -> None:
        self.argv[name] = argv
        env = {**os.environ, "GPUFLEET_LOG_LEVEL": "DEBUG", "GPUFLEET_LOG_FORMAT": "json"}
        with open(self.tmp / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log, env=env)

    def start(self) -> None:
        self.nats.start()
        asyncio.run(self._make_bucket())
        for name in HOPS:
            self.ports[name] = free_port()
        self.spawn("sim-a", self.sim_argv("a"))
        self.spawn("router-a", self.router_argv("a"))
        self.spawn("g1", [sys.executable, "-m", "gpufleet_cli", "gateway", "--name", "g1",
                          "--region", "us-east", "--port", str(self.ports["g1"]), "--state-dir",
                          str(self.tmp / "g1"), "--nats-url", self.nats.url, "--zones-only"])  # fmt: skip
        for name in HOPS:
            self.wait_http(self.ports[name])
        self.put_table(self.one_plane())
        self.wait_ranked("g1", "chat", {"a"})
        self.wait_warm("g1", "chat")

    def one_plane(self) -> RoutingTable:
        r = REGIONS[PLANES["a"]]
        plane = PlaneRoute(cluster="a", region=r.name, jurisdiction=r.jurisdiction,
                           endpoint=f"http://127.0.0.1:{self.ports['router-a']}",
                           latitude=r.latitude, longitude=r.longitude, replicas=1)  # fmt: skip
        self.generation += 1
        route = DeploymentRoute(name="chat", planes=[plane])
        return RoutingTable(generation=self.generation, deployments=[route], regions=[r])

    def lines(self, name: str) -> list[dict[str, Any]]:
        text = (self.tmp / f"{name}.log").read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def hops_with(self, request_id: str) -> set[str]:
        return {n for n in HOPS if any(x.get("request_id") == request_id for x in self.lines(n))}


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedPath]:
    fleet = LoggedPath(tmp_path_factory.mktemp("logged"))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


def _chat(stream: bool) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 24, "ignore_eos": True, "stream": stream}  # fmt: skip


def _streamed_text(body: str) -> str:
    pieces = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                pieces.append(choice["delta"].get("content") or "")
    return "".join(pieces)


def test_the_clients_request_id_is_on_a_line_of_every_hop(path: LoggedPath) -> None:
    url = f"{path.url('g1')}/v1/chat/completions"
    answer = httpx.post(url, json=_chat(False), headers={"X-Request-Id": "req-hops-1"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == "req-hops-1"
    assert answer.json()["id"] == "chatcmpl-req-hops-1"  # the replica was given the same id
    wait_until(lambda: path.hops_with("req-hops-1") == set(HOPS), 10, "a line at every hop")


def test_a_request_without_an_id_gets_one_at_the_gateway_that_every_hop_logs(path: LoggedPath) -> None:  # fmt: skip
    url = f"{path.url('g1')}/v1/chat/completions"
    with httpx.stream("POST", url, json=_chat(True), timeout=30) as answer:
        body = answer.read().decode()
    made = answer.headers["x-request-id"]
    assert answer.status_code == 200 and body.rstrip().endswith("data: [DONE]")
    assert len(made) == 32
    wait_until(lambda: path.hops_with(made) == set(HOPS), 10, "the made id at every hop")


def test_no_line_holds_the_prompt_or_the_completion(path: LoggedPath) -> None:
    url = f"{path.url('g1')}/v1/chat/completions"
    plain = httpx.post(url, json=_chat(False), headers={"X-Request-Id": "req-text"}, timeout=30)
    completion = plain.json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", url, json=_chat(True), headers={"X-Request-Id": "req-text-s"},
                      timeout=30) as answer:  # fmt: skip
        streamed = _streamed_text(answer.read().decode())
    assert len(completion.split()) == 24 and len(streamed.split()) == 24
    wait_until(lambda: {"req-text", "req-text-s"} <= {x.get("request_id") for x in path.lines("sim-a")}, 10, "both requests logged")  # fmt: skip
    for name in HOPS:
        text = (path.tmp / f"{name}.log").read_text()
        assert "zebra-quartz" not in text and "4111" not in text, f"{name} logged the prompt"
        for answer_text in (completion, streamed):
            assert answer_text.strip() not in text, f"{name} logged a completion"
        assert any(x["level"] == "DEBUG" for x in path.lines(name)), f"{name} not at DEBUG"
