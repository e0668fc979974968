"""What a write costs the database, and that the cheap path still does everything a write must:
the row's UPDATE, its audit entry, the representation a GET then reads, and the lookups of
references that did change (issue 13: ≥ 300 PATCH/s in bench/api.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event

from tests.integration.api import builders as b


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every SQL statement the engine sends while the block runs (its first word and table)."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = statement.split()
        table = next(
            (w for i, w in enumerate(words) if i and words[i - 1] in ("FROM", "INTO", "UPDATE")),
            "",
        )
        sent.append(f"{words[0]} {table}")

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_a_pool_patch_is_one_select_one_update_and_its_audit_insert(admin, engine):
    b.seed(admin)
    admin.patch("pools/aws-use1-h100-od", {"gpus": 65})  # the token is verified and cached
    with statements(engine) as sent:
        answer = admin.patch("pools/aws-use1-h100-od", {"gpus": 66})
    assert answer.status_code == 200
    assert sent == ["SELECT pools", "UPDATE pools", "INSERT audit_entries"]
    [entry, *_] = admin.get("audit", resource_name="aws-use1-h100-od").json()["items"]
    assert (entry["action"], entry["before"]["gpus"], entry["after"]["gpus"]) == ("update", 65, 66)


def test_an_unchanged_patch_is_one_select_and_writes_nothing(admin, engine):
    b.seed(admin)
    admin.get("pools/aws-use1-h100-od")
    with statements(engine) as sent:
        answer = admin.patch("pools/aws-use1-h100-od", {"gpus": 64})
    assert (answer.status_code, answer.json()["generation"]) == (200, 1)
    assert sent == ["SELECT pools"]


def test_a_patch_answers_what_the_next_get_reads(admin):
    b.seed(admin)
    admin.post("pools", b.reserved_pool())
    admin.post("deployments", b.deployment())
    for path, change in (
        ("pools/aws-use1-h100-od", {"gpus": 32, "instance_type": "p5.48xlarge"}),
        ("pools/aws-use1-h100-rsv", {"committed_gpus": 48}),
        ("clusters/use1-a", {"pools": ["aws-use1-h100-od", "aws-use1-h100-rsv"]}),
        ("clusters/use1-a", {"cordoned": True}),
        ("deployments/chat-llm", {"priority": 7, "autoscaling": {"max_replicas": 6}}),
        ("providers/aws-main", {"labels": {"team": "infra"}}),
    ):
        answer = admin.patch(path, change)
        assert answer.status_code == 200, answer.text
        read = admin.get(path)
        assert answer.json() == read.json(), path
        assert answer.headers["etag"] == read.headers["etag"]


def test_changed_references_are_still_looked_up_and_checked(admin):
    b.seed(admin)
    admin.post("providers", b.provider("gcp-main", provider_kind="gcp"))
    admin.post("regions", b.region("gcp-us-east4", provider="gcp-main"))
    admin.post("gpu-types", b.gpu_type("L4", memory_gib=24))
    pool = "pools/aws-use1-h100-od"

    foreign = admin.patch(pool, {"region": "gcp-us-east4"})
    assert foreign.status_code == 422
    assert "belongs to provider 'gcp-main'" in foreign.text
    unknown = admin.patch(pool, {"gpu_type": "B300"})
    assert unknown.status_code == 422 and "known: H100-80G, L4" in unknown.text
    missing = admin.patch("clusters/use1-a", {"pools": ["no-such-pool"]})
    assert missing.status_code == 422 and "no-such-pool" in missing.text

    moved = admin.patch(pool, {"provider": "gcp-main", "region": "gcp-us-east4", "gpu_type": "L4"})
    assert moved.status_code == 200, moved.text
    assert {k: admin.get(pool).json()[k] for k in ("provider", "region", "gpu_type")} == {
        "provider": "gcp-main",
        "region": "gcp-us-east4",
        "gpu_type": "L4",
    }


def test_two_writes_of_one_object_with_the_same_if_match_cannot_both_win(admin, engine):
    """The PATCH's SELECT locks the row: the second writer waits for the first and then sees
    its generation, so If-Match catches the race instead of both writing generation N+1."""
    import pytest
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from controlplane.errors import StaleGeneration
    from controlplane.services import inventory
    from controlplane.services.resources import KINDS

    b.seed(admin)
    pools, actor = KINDS["pools"], inventory.Actor("test")
    generation = admin.get("pools/aws-use1-h100-od").json()["generation"]
    with Session(engine) as first, Session(engine) as second:
        inventory.patch(first, pools, "aws-use1-h100-od", {"gpus": 70}, actor, generation)
        first.flush()  # holds the row lock until it commits
        second.execute(text("SET LOCAL lock_timeout = '200ms'"))
        with statements(engine) as sent, pytest.raises(OperationalError, match="lock"):
            inventory.patch(second, pools, "aws-use1-h100-od", {"gpus": 71}, actor, generation)
        assert sent == ["SELECT pools"]  # it waits at its read, before it checks If-Match
        second.rollback()
        first.commit()
        with pytest.raises(StaleGeneration, match=f"not {generation}"):
            inventory.patch(second, pools, "aws-use1-h100-od", {"gpus": 71}, actor, generation)
    assert admin.get("pools/aws-use1-h100-od").json()["gpus"] == 70


def test_every_core_written_kind_stores_what_its_orm_object_renders(admin, session_factory):
    """Kinds with `core_writes` are read and written with Core (services.rowviews): the
    answer, the next GET and the ORM object loaded afresh all agree, and a changed
    reference (a region moved to another provider) is stored as the foreign key."""
    from controlplane.services import inventory
    from controlplane.services.resources import KINDS

    b.seed(admin)
    admin.post("providers", b.provider("gcp-main", provider_kind="gcp"))
    admin.post("regions", b.region("aws-us-west-2"))
    admin.post("tokens", {"name": "ci", "role": "viewer"})
    admin.post("api-prices", {"name": "gpt", "model_id": "gpt-x", "input_price_per_mtok": "1.5",
                              "output_price_per_mtok": "6"})  # fmt: skip
    changes = {
        "providers/aws-main": {"certifications": ["SOC2"], "labels": {"team": "infra"}},
        "regions/aws-us-west-2": {"provider": "gcp-main", "latitude": 45.6},
        "gpu-types/H100-80G": {"memory_gib": 94},
        "pools/aws-use1-h100-od": {"gpus": 32, "instance_type": "p5.48xlarge"},
        "tokens/ci": {"role": "operator", "description": "CI"},
        "api-prices/gpt": {"output_price_per_mtok": "7.25", "source": "list price"},
    }
    assert {path.split("/")[0] for path in changes} == {
        k for k, kind in KINDS.items() if kind.core_writes
    }
    for path, change in changes.items():
        answer = admin.patch(path, change)
        assert answer.status_code == 200, answer.text
        assert answer.json()["generation"] == 2, path
        read = admin.get(path).json()
        assert answer.json() == read, path
        kind, name = KINDS[path.split("/")[0]], path.split("/")[1]
        with session_factory() as session:
            fresh = inventory.to_json(kind, inventory.get(session, kind, name))
        assert fresh == read, path
    assert admin.get("regions/aws-us-west-2").json()["provider"] == "gcp-main"


def test_a_core_write_expires_the_sessions_orm_copy_of_the_row(session_factory, admin):
    """One session that loaded a pool as an ORM object and then changed it through the Core
    path (a manifest apply does both) reads the new values, not its stale copy."""
    from controlplane.services import inventory
    from controlplane.services.resources import KINDS

    b.seed(admin)
    pools, actor = KINDS["pools"], inventory.Actor("test")
    with session_factory() as session, session.begin():
        loaded = inventory.get(session, pools, "aws-use1-h100-od")
        assert loaded.gpus == 64
        inventory.patch(session, pools, "aws-use1-h100-od", {"gpus": 12}, actor)
        assert (loaded.gpus, loaded.generation) == (12, 2)
    assert admin.get("pools/aws-use1-h100-od").json()["gpus"] == 12
