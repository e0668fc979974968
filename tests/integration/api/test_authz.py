"""Every route of the app × every role gets the expected answer.

The rule table is written here, independently of the app: a route the app grows without a
rule in this table fails the test, so nothing ships unguarded by accident.
"""

from __future__ import annotations

import re

from tests.integration.conftest import Api

PUBLIC = None
V, OP, A = "viewer", "operator", "admin"
RANK = {V: 0, OP: 1, A: 2}

INVENTORY_WRITE = {
    "providers": A,
    "regions": A,
    "gpu-types": A,
    "pools": OP,
    "clusters": OP,
    "deployments": OP,
    "tokens": A,
    "api-prices": OP,
}
READ = {k: V for k in INVENTORY_WRITE} | {
    "tokens": A,
    "placements": V,
    "replicas": V,
    "instances": V,
    "events": V,
    "audit": A,
}

RULES: dict[tuple[str, str], str | None] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/api/v1/deployments/{ref}/revisions"): V,
    ("GET", "/api/v1/deployments/{ref}/rollout"): V,
    ("GET", "/api/v1/deployments/{ref}/shadow"): V,
    ("POST", "/api/v1/deployments/{ref}/rollout/{command}"): OP,
    ("GET", "/api/v1/placement"): V,
    ("POST", "/api/v1/placement/preview"): V,
    ("POST", "/api/v1/placement/replan"): OP,
    ("GET", "/api/v1/costs"): V,
}
for kind, role in READ.items():
    RULES[("GET", f"/api/v1/{kind}")] = role
    RULES[("GET", f"/api/v1/{kind}/{{ref}}")] = role
for kind, role in INVENTORY_WRITE.items():
    RULES[("POST", f"/api/v1/{kind}")] = role
    for method in ("PUT", "PATCH", "DELETE"):
        RULES[(method, f"/api/v1/{kind}/{{ref}}")] = role


def _routes(app):
    """Every (method, path) the app serves, read from its OpenAPI document."""
    for path, operations in app.openapi()["paths"].items():
        for method in operations:
            yield method.upper(), path


def _call(api: Api, method: str, path: str):
    url = re.sub(r"\{[^}]+\}", "does-not-exist", path)
    if method in ("POST", "PUT", "PATCH"):
        return getattr(api, method.lower())(url, {})
    return getattr(api, method.lower())(url)


def test_every_route_has_a_rule(app_client):
    assert len(list(_routes(app_client.app))) >= 40, "the route walk found too few routes"
    missing = [r for r in _routes(app_client.app) if r not in RULES]
    assert not missing, f"routes without an authorization rule: {missing}"


def test_authorization_matrix(app_client, tokens):
    failures = []
    for method, path in _routes(app_client.app):
        required = RULES[(method, path)]
        anonymous = _call(Api(app_client, None), method, path).status_code
        if required is None:  # PUBLIC
            if anonymous in (401, 403):
                failures.append((method, path, "anonymous", anonymous))
            continue
        if anonymous != 401:
            failures.append((method, path, "anonymous", anonymous))
        bogus = _call(Api(app_client, "gpf_not-a-real-token"), method, path).status_code
        if bogus != 401:
            failures.append((method, path, "bogus token", bogus))
        for role, token in tokens.items():
            status = _call(Api(app_client, token), method, path).status_code
            allowed = RANK[role] >= RANK[required]
            if (allowed and status in (401, 403)) or (not allowed and status != 403):
                failures.append((method, path, role, status))
            if status >= 500:
                failures.append((method, path, role, status))
    assert not failures, failures
