"""A read never shows an older version of an object than the database holds, although each API
process renders an object once per version: writes by other processes (the Celery worker,
the bus process) and by plain Core UPDATEs are seen by the next read."""

from __future__ import annotations

from sqlalchemy import select, update

from controlplane.db import models as m
from controlplane.db.columns import set_status
from tests.integration.api import builders as b


def test_a_read_sees_a_change_made_through_the_api(admin) -> None:
    b.seed(admin)
    first = admin.get("pools/aws-use1-h100-od")
    assert admin.get("pools/aws-use1-h100-od").json() == first.json()  # rendered once
    admin.patch("pools/aws-use1-h100-od", {"gpus": first.json()["gpus"] + 8}).raise_for_status()
    again = admin.get("pools/aws-use1-h100-od")
    assert again.json()["gpus"] == first.json()["gpus"] + 8
    assert again.headers["etag"] == f'"{first.json()["generation"] + 1}"'


def test_a_read_sees_what_another_process_wrote(admin, session_factory) -> None:
    b.seed(admin)
    assert admin.get("pools/aws-use1-h100-od").json()["status"].get("held_gpus", 0) == 0
    with session_factory() as s, s.begin():  # as procurement in the worker does
        pool = s.scalars(select(m.Pool).where(m.Pool.name == "aws-use1-h100-od")).one()
        set_status(pool, held_gpus=16)
    assert admin.get("pools/aws-use1-h100-od").json()["status"]["held_gpus"] == 16

    assert admin.get("clusters/use1-a").json()["status"]["agent_version"] in (None, "")
    with session_factory() as s, s.begin():  # a Core UPDATE, as heartbeats may be recorded
        s.execute(update(m.Cluster).where(m.Cluster.name == "use1-a").values(agent_version="9.9"))
    assert admin.get("clusters/use1-a").json()["status"]["agent_version"] == "9.9"


def test_a_deleted_object_is_gone_for_the_next_read(admin) -> None:
    b.seed(admin)
    assert admin.get("gpu-types/H100-80G").status_code == 200
    admin.post("gpu-types", {"name": "B200-192G", "memory_gib": 192}).raise_for_status()
    assert admin.get("gpu-types/B200-192G").status_code == 200
    assert admin.delete("gpu-types/B200-192G").status_code == 204
    gone = admin.get("gpu-types/B200-192G")
    assert gone.status_code == 404
    assert gone.headers["content-type"] == "application/problem+json"
