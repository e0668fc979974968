"""Every change leaves an audit entry; token secrets never leave the creation response."""

from __future__ import annotations

import logging

from tests.integration.api import builders as b


def test_every_mutation_is_audited_with_actor_before_and_after(admin, operator):
    b.seed(admin)
    operator.post("deployments", b.deployment())
    operator.put("deployments/chat-llm", b.deployment(priority=500))
    operator.put("deployments/chat-llm", b.deployment(priority=500))  # unchanged: no entry
    operator.patch("deployments/chat-llm", {"priority": 600})
    operator.delete("deployments/chat-llm")

    entries = admin.get("audit", resource_kind="Deployment").json()["items"]
    assert [e["action"] for e in entries] == ["delete", "update", "update", "create"]
    assert {e["actor"] for e in entries} == {"token:operator-token"}
    delete, patch, put, create = entries
    assert create["before"] is None and create["after"]["priority"] == 100
    assert (put["before"]["priority"], put["after"]["priority"]) == (100, 500)
    assert (patch["before"]["priority"], patch["after"]["priority"]) == (500, 600)
    assert delete["after"] is None and delete["before"]["name"] == "chat-llm"

    seeded = admin.get("audit", actor="token:admin-token").json()["items"]
    assert {e["resource_kind"] for e in seeded} == {
        "Provider",
        "Region",
        "GpuType",
        "Pool",
        "Cluster",
    }


def test_token_secret_is_shown_once_and_never_again(admin, caplog):
    caplog.set_level(logging.DEBUG)
    created = admin.post("tokens", {"name": "ci-bot", "role": "operator"})
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith("gpf_")

    seen = [
        admin.get("tokens").text,
        admin.get("tokens/ci-bot").text,
        admin.patch("tokens/ci-bot", {"description": "deploys from CI"}).text,
        admin.get("audit").text,
        admin.get("events").text,
    ]
    for text in seen:
        assert secret not in text
        assert secret[4:] not in text
    assert secret not in caplog.text
    assert created.json()["status"]["prefix"] == secret[:10]

    bot = admin.__class__(admin.client, secret)
    assert bot.get("pools").status_code == 200
    assert bot.post("tokens", {"name": "escalate", "role": "admin"}).status_code == 403


def test_the_last_admin_token_cannot_be_removed(admin, session_factory):
    from controlplane.services.tokens import ensure_admin_token

    assert admin.delete("tokens/viewer-token").status_code == 204
    refused = admin.delete("tokens/admin-token")
    assert refused.status_code == 409
    assert "create another admin token first" in refused.json()["detail"]
    with session_factory() as s, s.begin():
        assert ensure_admin_token(s) is None  # tokens exist: no second bootstrap token


def test_a_new_cluster_gets_nats_credentials_once_and_only_a_hash_is_kept(admin, session_factory):
    from controlplane.db import models as m
    from tests.integration.api import builders as b

    b.seed(admin)
    created = admin.post("clusters", b.cluster("use1-b"))
    creds = created.json()["nats_credentials"]
    assert creds["user"] == "cluster-use1-b"
    assert len(creds["password"]) >= 40
    shown = admin.get("clusters/use1-b").text + admin.get("audit").text
    assert creds["password"] not in shown
    assert "nats_credentials" not in shown
    with session_factory() as s:
        row = s.query(m.Cluster).filter_by(name="use1-b").one()
        assert row.nats_password_hash.startswith("$2")
        assert creds["password"] not in row.nats_password_hash


def test_the_last_admin_token_cannot_be_expired_and_an_expired_one_does_not_count(
    admin, session_factory
):
    """`expires_at` in the past on the last admin token locked every admin out; and an
    expired admin token counted as "another admin", so the last working one could go."""
    from datetime import UTC, datetime, timedelta

    from controlplane.db import models as m

    refused = admin.patch("tokens/admin-token", {"expires_at": "2000-01-01T00:00:00Z"})
    assert refused.status_code == 409, refused.text
    assert "cannot expire the last admin token" in refused.json()["detail"]
    created = admin.post("tokens", {"name": "old-admin", "role": "admin"})
    assert created.status_code == 201
    with session_factory() as s, s.begin():  # it expired yesterday
        old = s.query(m.ApiToken).filter_by(name="old-admin").one()
        old.expires_at = datetime.now(UTC) - timedelta(days=1)
    refused = admin.delete("tokens/admin-token")
    assert refused.status_code == 409 and "last admin token" in refused.json()["detail"]
