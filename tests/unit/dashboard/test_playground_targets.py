"""The playground's list of where a prompt can go: each gateway, then each plane's router."""

from __future__ import annotations

from controlplane.dashboard.web import playground_targets
from controlplane.settings import GatewayEndpoint


def test_gateways_come_first_with_every_served_model_then_each_router() -> None:
    gateways = {"use1": GatewayEndpoint(url="http://gw", region="aws-us-east-1")}
    routers = {"use1-a": "http://r1", "euc1-a": "http://r2"}
    models = {"use1-a": ["triage-llm"], "euc1-a": ["eu-assistant"], "far-a": ["no-router"]}
    assert playground_targets(gateways, routers, models) == [
        ("gateway:use1|eu-assistant", "eu-assistant via gateway use1 (aws-us-east-1)"),
        ("gateway:use1|triage-llm", "triage-llm via gateway use1 (aws-us-east-1)"),
        ("euc1-a|eu-assistant", "eu-assistant on euc1-a (its router)"),
        ("use1-a|triage-llm", "triage-llm on use1-a (its router)"),
    ]


def test_no_router_serves_anything_no_target() -> None:
    gateways = {"use1": GatewayEndpoint(url="http://gw", region="r")}
    assert playground_targets(gateways, {}, {"use1-a": ["m"]}) == []
