"""The gateway's front fuzzed as the plane's router's is (``dataplane/test_front_fuzz.py``:
the same mangled requests, checks and raw-socket table), plus the headers only the gateway
reads (residency, the client's region), against this suite's real fleet: no 5xx, no hang,
OpenAI-shaped 4xx, and afterwards every process of the fleet alive and serving.

One 5xx is the gateway's designed answer: a residency (``x-gpufleet-jurisdiction``) that no
plane of the deployment is in gets a 503 naming it, never a cross-border route.
"""

from __future__ import annotations

import httpx
from hypothesis import strategies as st

from tests.integration.dataplane.test_front_fuzz import (
    HEADERS,
    ONCE_WRONG,
    Probe,
    fuzz,
    header_values,
    openai_error,
    probes,
    problems,
    raw_problems,
)
from tests.integration.gateway.conftest import PLANES, REGIONS, Fleet, chat

EXAMPLES = 200
KEPT = frozenset({"max_tokens", "max_completion_tokens"})
"""The fleet's replicas make 40 tokens a second: a request for a whole context would take a
minute, so the length asked for is never mangled (nor dropped)."""
JURISDICTIONS = {REGIONS[region].jurisdiction for region in PLANES.values()}
GATEWAY_HEADERS = HEADERS | {
    "x-gpufleet-jurisdiction": st.sampled_from(
        [b"DE", b"us", b"US,DE", b" de , xx ", b"XX", b",", b"\xc3\x9f"]
    )
    | header_values,
    "x-gpufleet-client-region": st.sampled_from([b"eu-central", b"us-west", b"nowhere"])
    | header_values,
    "x-gpufleet-cross-region": st.sampled_from([b"1", b"0", b"yes"]),
}


def outside_the_fleet(probe: Probe) -> bool:
    """The residency asked for leaves no plane of the fleet (the gateway's own reading)."""
    raw = dict(probe.headers).get("x-gpufleet-jurisdiction", b"").decode(errors="replace")
    asked = {j.strip().upper() for j in raw.split(",") if j.strip()}
    return bool(asked) and not asked & JURISDICTIONS


def judged(probe: Probe, answer: httpx.Response) -> list[str]:
    if answer.status_code == 503 and outside_the_fleet(probe):
        refused = openai_error(answer.content) and answer.headers.get("x-request-id")
        return [] if refused else ["a residency refusal that is not an OpenAI-shaped error"]
    return problems(probe, answer)


def test_no_request_gets_a_5xx_from_the_gateway_or_ends_a_process(fleet: Fleet):
    run = fuzz(fleet.url("g1"), probes(KEPT, GATEWAY_HEADERS), EXAMPLES, judged, ONCE_WRONG)
    framed = raw_problems(fleet.ports["g1"])
    dead = {name: p.returncode for name, p in fleet.procs.items() if p.poll() is not None}
    answer = httpx.post(f"{fleet.url('g1')}/v1/chat/completions", json=chat(), timeout=10)
    run.check(EXAMPLES)
    assert not framed, "\n".join(framed)
    assert not dead, f"processes of the fleet ended: {dead}"
    assert answer.status_code == 200 and answer.json()["choices"], answer.text
    print(f"{EXAMPLES} requests to the gateway: {run}")
