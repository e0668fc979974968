"""Contract stability: every message's JSON Schema is snapshotted; v1 only grows additively.

After a deliberate, additive change run with GPUFLEET_UPDATE_SNAPSHOTS=1 and commit the
updated files under tests/unit/bus/snapshots/ (the diff is what reviewers read).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from controlplane import contracts as c

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("GPUFLEET_UPDATE_SNAPSHOTS") == "1"


def schema_of(model: type) -> dict:
    return model.model_json_schema(mode="validation")


def all_objects(schema: dict) -> dict[str, dict]:
    """Every object schema in a message schema: the message itself and its $defs."""
    objects = {"<message>": schema}
    objects.update(schema.get("$defs", {}))
    return objects


@pytest.mark.parametrize("model", c.MESSAGE_TYPES, ids=lambda m: m.__name__)
def test_schema_matches_snapshot(model: type):
    path = SNAPSHOTS / f"{model.__name__}.json"
    current = schema_of(model)
    if UPDATE or not path.exists():
        path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    snapshot = json.loads(path.read_text())
    assert current == snapshot, (
        f"{model.__name__}'s schema changed. If it is an additive change with defaults, "
        "run GPUFLEET_UPDATE_SNAPSHOTS=1 pytest tests/unit/bus and commit the snapshot; "
        "anything else needs schema version 2."
    )


def incompatibilities(snapshot: dict, current: dict) -> list[str]:
    """What breaks v1 readers or writers: removed types or fields, fields newly required."""
    problems = []
    before, now = all_objects(snapshot), all_objects(current)
    for name, old in before.items():
        if name not in now:
            problems.append(f"type {name} disappeared")
            continue
        new = now[name]
        removed = set(old.get("properties", {})) - set(new.get("properties", {}))
        problems += [f"{name}.{f} removed" for f in sorted(removed)]
        required = set(new.get("required", [])) - set(old.get("required", []))
        problems += [f"{name}.{f} is required (added without a default?)" for f in sorted(required)]
    return problems


@pytest.mark.parametrize("model", c.MESSAGE_TYPES, ids=lambda m: m.__name__)
def test_only_additive_changes_with_defaults(model: type):
    """Against the committed snapshot: no field removed, none newly required."""
    snapshot = json.loads((SNAPSHOTS / f"{model.__name__}.json").read_text())
    assert incompatibilities(snapshot, schema_of(model)) == [], (
        "within v1 only additive fields with defaults are allowed"
    )


def test_the_check_catches_a_field_added_without_default():
    class V1(c.Model):
        a: int

    class Grown(c.Model):
        a: int
        b: int = 0

    class Broken(c.Model):
        a: int
        b: int

    assert incompatibilities(schema_of(V1), schema_of(Grown)) == []
    assert incompatibilities(schema_of(V1), schema_of(Broken)) == [
        "<message>.b is required (added without a default?)"
    ]
    assert incompatibilities(schema_of(Grown), schema_of(V1)) == ["<message>.b removed"]


def test_unknown_fields_are_ignored():
    applied = c.DesiredStateApplied(cluster="a", source="cluster/a", generation=3)
    raw = json.loads(c.encode(applied))
    raw["added_in_v1_9"] = {"anything": True}
    decoded = c.decode_report(json.dumps(raw).encode())
    assert decoded == applied


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"nope", "malformed"),
        (b"[]", "malformed"),
        (b'{"type": "observed_state", "cluster": "a"}', "schema_version"),
        (b'{"schema_version": 2, "type": "observed_state"}', "schema_version"),
        (b'{"schema_version": 1, "type": "no_such_type"}', "invalid"),
        (b'{"schema_version": 1, "type": "observed_state", "cluster": "A B"}', "invalid"),
    ],
)
def test_bad_messages_are_rejected_with_a_reason(data: bytes, reason: str):
    with pytest.raises(c.RejectedMessageError) as err:
        c.decode_report(data)
    assert err.value.reason == reason


DEEP = b"[" * 100_000 + b"]" * 100_000  # well inside NATS's 1 MB, far past json's recursion


@pytest.mark.parametrize(
    "decode",
    [c.decode_report, c.decode_desired, c.decode_routing_table, c.decode_plane_load],
)
def test_json_nested_too_deeply_is_rejected_not_a_crash(decode):
    """A forged message nested past the JSON parser's recursion limit is rejected like any
    malformed one (a RecursionError would escape every caller's handler)."""
    with pytest.raises(c.RejectedMessageError) as err:
        decode(DEEP)
    assert err.value.reason == "malformed"
    assert "nested too deeply" in str(err.value)


def test_every_message_round_trips():
    replica = c.ReplicaStatus(replica_id="r1", deployment="chat", revision="r1", state="ready")
    samples = [
        c.ObservedState(
            cluster="a",
            source="cluster/a",
            replicas=[replica],
            deployments=[c.DeploymentObserved(name="chat", demand=9)],
        ),
        c.ReplicaStarted(cluster="a", source="cluster/a", replica=replica),
        c.ReplicaFailed(cluster="a", source="cluster/a", replica=replica, reason="oom"),
        c.SpotInterruptionNoticed(cluster="a", source="cluster/a", instance_id="i-1"),
        c.NodeUnhealthy(cluster="a", source="cluster/a", instance_id="i-1", reason="xid 79"),
        c.CapacityExhausted(cluster="a", source="cluster/a", deployment="chat", wanted=2),
        c.DesiredStateApplied(cluster="a", source="cluster/a", generation=1),
    ]
    for message in samples:
        assert c.decode_report(c.encode(message)) == message
    desired = c.DesiredState(
        cluster="a",
        generation=1,
        deployments=[
            c.DeploymentDesired(name="chat", spec=c.RevisionSpec(model_id="m", revision="r1"))
        ],
    )
    assert c.decode_desired(c.encode(desired)) == desired


def test_names_live_in_one_place():
    assert c.desired_subject("a") == f"$KV.{c.DESIRED_BUCKET}.a"
    assert c.fact_subject("a", "replica_failed") == "gpufleet.v1.cluster.a.fact.replica_failed"
    assert c.cluster_from_subject(c.observed_subject("edge-1")) == "edge-1"
    assert c.cluster_from_subject("other.subject") is None
    with pytest.raises(ValueError, match="invalid cluster name"):
        c.observed_subject("a.b")
    for forged in ("a\n", "a\r\nPUB x 1", "a b", "", "A"):  # no second line on the wire
        with pytest.raises(ValueError, match="invalid cluster name"):
            c.check_cluster_name(forged)


def test_quota_max_below_min_is_refused():
    with pytest.raises(ValueError, match="must be >= min"):
        c.ReplicaQuota(min=3, max=1)


def test_whole_number_takes_only_ascii_digits_within_its_bound():
    assert c.whole_number("42") == 42 and c.whole_number("0") == 0
    assert c.whole_number("123", max_digits=2) is None
    for text in ("\u00b2", "\u0663", "-1", " 1", "1.0", "", "1" * 5000):  # int() fails on some
        assert c.whole_number(text) is None, text


def _report(**fields) -> bytes:
    base = {"source": "cluster/p1", "cluster": "p1"}
    return json.dumps({**base, **fields}).encode()


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "observed_state", "agent_version": "v\u0000"},  # PostgreSQL refuses NUL
        {"type": "observed_state", "agent_version": "v" * 33},  # its column is 32
        {"type": "node_unhealthy", "instance_id": "i" * 129},
        {"type": "node_unhealthy", "instance_id": "i-1", "reason": "r" * 1025},
        {
            "type": "replica_failed",
            "replica": {
                "replica_id": "r\u0000",
                "deployment": "d",
                "revision": "1",
                "state": "failed",
            },
        },
        {
            "type": "observed_state",
            "deployments": [{"name": "d", "usage": {"since": "s", "input_tokens": 2**63}}],
        },  # past BIGINT
        {
            "type": "observed_state",
            "deployments": [
                {"name": "d", "outcomes": {"since": "s", "requests": 5, "ttft_buckets": [3, -9]}}
            ],
        },
    ],
)
def test_a_report_the_database_could_not_keep_is_rejected_at_the_door(fields):
    """Accepted, it would fail in the database on every redelivery and hold the reports
    stream's ack floor (and every plane's liveness) for ever; a negative latency bucket
    would hide another plane's slow requests from a canary's p99 gate."""
    with pytest.raises(c.RejectedMessageError):
        c.decode_report(_report(**fields))


def test_a_report_time_without_a_zone_is_taken_as_utc():
    naive = c.decode_report(_report(type="node_unhealthy", instance_id="i-1",
                                    time="2026-12-07T08:00:00", deadline=None))  # fmt: skip
    assert naive.time.utcoffset() is not None
    spot = c.decode_report(_report(type="spot_interruption_noticed", instance_id="i-1",
                                   deadline="2026-12-07T08:02:00"))  # fmt: skip
    assert isinstance(spot, c.SpotInterruptionNoticed)
    assert spot.deadline is not None and spot.deadline.utcoffset() is not None


def test_a_value_the_database_refuses_becomes_a_rejected_report_not_a_retry():
    from sqlalchemy.exc import DataError

    from controlplane.services.observed import _refused_by_the_database

    fact = c.NodeUnhealthy(source="cluster/p1", cluster="p1", instance_id="i-1")
    with pytest.raises(c.RejectedMessageError) as err, _refused_by_the_database(fact):
        raise DataError("INSERT …", {}, ValueError("value too long for type character(32)"))
    assert err.value.reason == "invalid_value" and str(fact.id) in err.value.detail


@pytest.mark.parametrize(
    "load",
    [
        {"deployments": [{"name": "chat", "capacity": 10**400}]},  # overflowed the ranking
        {"deployments": [{"name": "chat", "service_rate": "Infinity"}]},
        {"interval_seconds": 1e308},  # a plane that stops would never be missed
        # ~20k entries fit under the byte cap, each scanned on every request routed
        {"deployments": [{"name": ""}] * (c.MAX_PLANE_LOAD_DEPLOYMENTS + 1)},
    ],
    ids=["capacity", "service_rate", "interval", "entries"],
)
def test_a_plane_load_report_a_gateway_could_not_rank_with_is_refused(load):
    raw = json.dumps({"source": "cluster/p1", "cluster": "p1", "type": "plane_load", **load})
    with pytest.raises(c.RejectedMessageError):
        c.decode_plane_load(raw.encode())


def _desired(deployments: list[dict], **extra: object) -> bytes:
    return json.dumps(
        {
            "type": "desired_state",
            "source": "controlplane",
            "cluster": "a",
            "generation": 1,
            "schema_version": 1,
            "deployments": deployments,
            **extra,
        }
    ).encode()


def _entry(name: str = "chat", revision: str = "1", **extra: object) -> dict:
    return {"name": name, "spec": {"model_id": "m", "revision": revision}, **extra}


@pytest.mark.parametrize(
    ("deployments", "extra", "says"),
    [
        # one small message must not make an agent start a billion replicas
        ([_entry(quota={"min": 10**9, "max": 10**9})], {}, "less than or equal to 10000"),
        ([_entry(pool_quotas=[{"pool": "p", "max": 10**6}])], {}, "less than or equal to 10000"),
        # names and revisions become replica ids (at most 128) and log file names
        ([_entry(name="x" * 81)], {}, "at most 80 characters"),
        ([_entry(name="../etc")], {}, "should match pattern"),
        ([_entry(name="chat\x00")], {}, "should match pattern"),
        ([_entry(revision="r" * 33)], {}, "should match pattern"),
        # two entries of one name would each stop the other's replicas, for ever
        ([_entry(revision="1"), _entry(revision="2")], {}, "deployment chat is listed twice"),
        ([], {"generation": 2**64}, "less than or equal to"),
    ],
)
def test_a_desired_state_an_agent_cannot_act_on_is_rejected(deployments, extra, says):
    with pytest.raises(c.RejectedMessageError) as err:
        c.decode_desired(_desired(deployments, **extra))
    assert err.value.reason == "invalid" and says in str(err.value), str(err.value)


def test_a_drain_deadline_without_a_zone_is_read_as_utc():
    """Compared with the agent's aware clock, a naive one raised on every reconcile pass."""
    instance = {"id": "i-1", "pool": "p", "draining": True, "drain_deadline": "2030-01-01T00:00:00"}
    desired = c.decode_desired(_desired([_entry()], instances=[instance]))
    deadline = desired.instances[0].drain_deadline
    assert deadline is not None and deadline.utcoffset() == timedelta(0)


def _beat(**fields: object) -> bytes:
    return json.dumps(
        {"type": "observed_state", "source": "cluster/p1", "cluster": "p1", **fields}
    ).encode()


@pytest.mark.parametrize(
    "raw",
    [
        # past int64: the sink's arithmetic and columns failed, the message was redelivered
        # for good and held the consumer's ack floor (liveness suspended fleet-wide)
        _beat(observed_generation=2**63),
        _beat(deployments=[{"name": "chat", "demand": 10**30}]),
        _beat(free_capacity=[{"gpu_type": "H100", "gpus": 1, "waiting_replicas": {"x" * 200: 1}}]),
        _beat(
            free_capacity=[
                {
                    "gpu_type": "H100",
                    "gpus": 1,
                    "waiting_replicas": {f"d{i}": 1 for i in range(5000)},
                }
            ]
        ),
        _beat(free_capacity=[{"gpu_type": "H100", "gpus": -1}]),
        _beat(deployments=[{"name": f"d{i}"} for i in range(c.MAX_REPORT_ENTRIES + 1)]),
        _beat(agent_version="x" * 10) + b" " * c.MAX_REPORT_BYTES,  # over the byte cap
    ],
    ids=["generation", "demand", "waiting-name", "waiting-many", "gpus", "entries", "bytes"],
)
def test_a_heartbeat_out_of_bounds_is_refused_not_recorded(raw: bytes):
    with pytest.raises(c.RejectedMessageError):
        c.decode_report(raw)


def test_a_heartbeat_within_bounds_is_read():
    beat = c.decode_report(_beat(observed_generation=2**63 - 1, free_capacity=[
        {"gpu_type": "H100", "gpus": 8, "waiting_replicas": {"chat": 2}}]))  # fmt: skip
    assert isinstance(beat, c.ObservedState) and beat.free_capacity[0].waiting_replicas == {
        "chat": 2
    }


@pytest.mark.parametrize(
    ("sent", "read"),
    [
        ("0001-01-01T00:00:00+01:00", "1970-01-01T00:00:00+00:00"),  # before year 1 in UTC
        ("1969-12-31T23:59:59Z", "1970-01-01T00:00:00+00:00"),
        ("9999-12-31T23:00:00-05:00", "2999-12-31T23:59:59+00:00"),  # after year 9999 in UTC
        ("2026-12-07T10:00:00+02:00", "2026-12-07T08:00:00+00:00"),
    ],
)
def test_a_report_time_is_read_in_utc_within_what_the_database_reads_back(sent, read):
    fact = c.decode_report(_report(type="node_unhealthy", instance_id="i-1", time=sent))
    assert fact.time.isoformat() == read
