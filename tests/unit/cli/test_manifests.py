"""Manifests, kinds and plans without a server: what `apply` would do, field by field."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.cli.manifests import (
    ALL_KINDS,
    WRITABLE,
    Action,
    CliError,
    as_manifest,
    changed_paths,
    is_unset,
    load_manifests,
    parse_documents,
    plan_one,
    resolve_kind,
)
from controlplane.services.resources import KINDS


def pool(**kw: Any) -> dict[str, Any]:
    return {
        "kind": "Pool",
        "name": "gpu-a",
        "provider": "aws-main",
        "region": "use1",
        "gpu_type": "H100-80G",
        "purchase_type": "on_demand",
        "gpus": 64,
        "price_per_gpu_hour": "3.9",
        "quota_gpus": 128,
    } | kw


def deployment(**kw: Any) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "name": "chat",
        "model_id": "m/x",
        "gpus_per_replica": 1,
        "gpu_types": ["H100-80G"],
        "autoscaling": {"max_replicas": 4},
    } | kw


def served(doc: dict[str, Any], **status: Any) -> dict[str, Any]:
    """The object as the API returns it: spec fields plus metadata."""
    (manifest,) = load_manifests_from([doc])
    return manifest.body | {
        "kind": manifest.kind.name,
        "id": "0f",
        "generation": 3,
        "created_at": "2026-01-01T00:00:00+00:00",
        "status": status,
    }


def load_manifests_from(docs: list[dict[str, Any]]) -> list[Any]:
    import yaml

    return load_manifests(yaml.safe_dump_all(docs), "f.yaml")


@pytest.mark.parametrize(
    ("word", "path"),
    [
        ("pool", "pools"),
        ("Pools", "pools"),
        ("deploy", "deployments"),
        ("gpu-type", "gpu-types"),
        ("gpu_types", "gpu-types"),
        ("GpuType", "gpu-types"),
        ("ev", "events"),
        ("audit", "audit"),
        ("replica", "replicas"),
    ],
)
def test_kind_aliases(word: str, path: str) -> None:
    assert resolve_kind(word).path == path


def test_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(CliError, match="unknown kind 'flavour'; use one of: providers") as exc:
        resolve_kind("flavour")
    assert exc.value.exit_code == 2


def test_aliases_are_unambiguous_and_writable_kinds_match_the_api() -> None:
    words = [w for k in ALL_KINDS for w in {k.name.lower(), k.path, *k.aliases}]
    assert len(words) == len(set(words))
    assert {k.path: (k.name, k.spec) for k in WRITABLE} == {
        path: (k.kind, k.spec) for path, k in KINDS.items()
    }


def test_documents_lists_and_line_numbers() -> None:
    text = "# fleet\nkind: GpuType\nname: H100\nmemory_gib: 80\n---\n---\nkind: List\nitems:\n  - {kind: GpuType, name: L4, memory_gib: 24}\n"
    docs = parse_documents(text, "f.yaml")
    assert [(d.source, d.body["name"]) for d in docs] == [
        ("f.yaml:2", "H100"),
        ("f.yaml:7 items[0]", "L4"),
    ]


def test_bad_yaml_names_the_line() -> None:
    with pytest.raises(CliError) as exc:
        parse_documents("kind: Pool\nname: a\n  gpus: 1\n", "f.yaml")
    assert exc.value.exit_code == 2
    assert exc.value.message.startswith("f.yaml:3: not valid YAML: ")


def test_invalid_spec_is_one_line_with_every_field() -> None:
    with pytest.raises(CliError) as exc:
        load_manifests_from([pool(gpus=-1, colour="red")])
    assert exc.value.message == (
        "f.yaml:1: pools 'gpu-a': gpus: Input should be greater than or equal to 0; colour: "
        "unknown field; remove it (check the spelling against the schema)"
    )


def test_duplicates_and_read_only_kinds_are_refused() -> None:
    with pytest.raises(CliError, match=r"also defined at f\.yaml:1"):
        load_manifests_from([pool(), pool()])
    with pytest.raises(CliError, match="events are read-only"):
        load_manifests_from([{"kind": "Event", "name": "x"}])
    with pytest.raises(CliError, match="missing `kind:`"):
        load_manifests_from([{"name": "x"}])


def test_manifests_come_back_in_dependency_order() -> None:
    docs = [
        deployment(),
        pool(),
        {
            "kind": "Provider",
            "name": "aws-main",
            "provider_kind": "aws",
            "provider_class": "hyperscaler",
        },
        {"kind": "GpuType", "name": "H100-80G", "memory_gib": 80},
    ]
    kinds = [m.kind.name for m in load_manifests_from(docs)]
    assert kinds == ["Provider", "GpuType", "Pool", "Deployment"]


def test_new_object_is_a_create() -> None:
    (m,) = load_manifests_from([pool()])
    assert plan_one(m, None).action == Action.create


def test_defaults_number_formats_and_order_are_not_changes() -> None:
    (m,) = load_manifests_from([deployment(gpu_types=["L4", "H100-80G", "L4"])])
    server = served(deployment(gpu_types=["H100-80G", "L4"]), revision=1)
    assert plan_one(m, server).action == Action.unchanged
    (p,) = load_manifests_from([pool(price_per_gpu_hour=3.9)])
    assert plan_one(p, served(pool()) | {"price_per_gpu_hour": "3.900000"}).action == (
        Action.unchanged
    )


def test_update_lists_nested_fields_old_to_new() -> None:
    (m,) = load_manifests_from([deployment(autoscaling={"max_replicas": 8}, priority=300)])
    change = plan_one(m, served(deployment()))
    assert change.action == Action.update
    assert change.generation == 3
    assert [(f.path, f.old, f.new) for f in change.fields] == [
        ("autoscaling.max_replicas", 4, 8),
        ("priority", 100, 300),
    ]


def test_removed_optional_field_shows_as_unset() -> None:
    (m,) = load_manifests_from([pool(quota_gpus=None)])
    (field,) = plan_one(m, served(pool())).fields
    assert (field.path, field.old) == ("quota_gpus", 128)
    assert is_unset(field.new)


def test_changed_paths_recurse_into_mappings_only() -> None:
    old = {"a": {"b": 1, "c": [1, 2]}, "labels": {"team.io/x": "1"}}
    new = {"a": {"b": 2, "c": [1, 2, 3]}, "labels": {"team.io/x": "1", "y": "2"}}
    assert changed_paths(old, new) == [("a", "b"), ("a", "c"), ("labels", "y")]


def test_server_object_becomes_a_manifest_without_metadata() -> None:
    (kind,) = [k for k in WRITABLE if k.name == "Pool"]
    doc = as_manifest(kind, served(pool()))
    assert next(iter(doc)) == "kind" and doc["kind"] == "Pool"
    assert not {"id", "generation", "created_at", "status"} & set(doc)
    (again,) = load_manifests_from([doc])
    assert plan_one(again, served(pool())).action == Action.unchanged


def test_a_manifest_in_the_old_spelling_is_sent_and_compared_in_the_new_one() -> None:
    old = {"max_replicas": 4, "concurrency_target": 16, "scale_to_zero_idle_s": 300}
    (m,) = load_manifests_from([deployment(autoscaling=old, placement={"min_regions": 2})])
    assert m.body["autoscaling"]["target_concurrency"] == 16.0
    assert m.body["autoscaling"]["scale_to_zero_idle_seconds"] == 300.0
    assert m.body["placement"]["min_distinct_regions"] == 2
    new = {"max_replicas": 4, "target_concurrency": 16, "scale_to_zero_idle_seconds": 300}
    server = served(deployment(autoscaling=new, placement={"min_distinct_regions": 2}))
    assert plan_one(m, server).action == Action.unchanged


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("kind: GpuType\nname: a\nmemory_gib: 80\nmemory_gib: 90\n", 4, "memory_gib"),
        ("kind: Pool\nname: a\n---\nkind: Cluster\nname: c\npools: []\nname: d\n", 7, "name"),
        (
            "kind: Deployment\nautoscaling:\n  min_replicas: 1\n  min_replicas: 2\n",
            4,
            "min_replicas",
        ),
    ],
)
def test_a_key_given_twice_is_refused_naming_the_key_and_its_line(text, line, key):
    with pytest.raises(CliError) as refused:
        parse_documents(text, "fleet.yaml")
    assert refused.value.exit_code == 2
    assert refused.value.message.startswith(f"fleet.yaml:{line}: ")
    assert f"duplicate key '{key}'" in refused.value.message


@pytest.mark.parametrize("nested", ["[" * 5000 + "]" * 5000, "{a: " * 5000 + "1" + "}" * 5000])
def test_yaml_nested_too_deeply_is_refused_not_a_traceback(nested):
    with pytest.raises(CliError) as refused:
        parse_documents(f"kind: Pool\nname: a\nlabels: {nested}\n", "fleet.yaml")
    assert refused.value.exit_code == 2
    assert (
        refused.value.message
        == "fleet.yaml: not valid YAML: nested too deeply; flatten the structure"
    )


def test_the_same_key_in_sibling_mappings_and_merged_anchors_is_fine():
    text = "kind: List\nitems:\n  - {kind: GpuType, name: a, memory_gib: 8}\n  - {kind: GpuType, name: b, memory_gib: 8}\n"
    assert [m.name for m in load_manifests(text, "f.yaml")] == ["a", "b"]
    merged = (
        "kind: List\nitems:\n  - &g {kind: GpuType, name: a, memory_gib: 8}\n"
        "  - {<<: *g, name: b}\n"
    )
    assert [m.name for m in load_manifests(merged, "f.yaml")] == ["a", "b"]


def test_true_is_not_a_number_in_a_manifest():
    with pytest.raises(CliError) as refused:
        load_manifests("kind: GpuType\nname: a\nmemory_gib: true\n", "f.yaml")
    assert "memory_gib: must be a number" in refused.value.message


def test_an_object_stored_before_todays_limits_is_an_update_not_a_traceback() -> None:
    """The server keeps showing such an object as stored; validated as a spec it raised a
    ValidationError out of `apply` and `diff`."""
    (m,) = load_manifests_from([pool(gpus=64)])
    change = plan_one(m, served(pool()) | {"gpus": 2_000_000})
    assert change.action == Action.update and change.generation is not None


@pytest.mark.parametrize("empty", [False, True], ids=["objects", "empty-lists"])
def test_a_file_of_nested_list_aliases_is_refused_before_it_expands(empty: bool) -> None:
    """A 700-byte file of nine nested `kind: List`s, each naming the last nine times,
    expanded into ~387 million objects (or visits, for empty Lists) and ran out of memory."""
    leaf = "{kind: List, items: []}" if empty else "{kind: GpuType, name: a, memory_gib: 8}"
    lines = [f"l0: &l0 {leaf}"]
    for n in range(1, 10):
        lines.append(f"l{n}: &l{n} {{kind: List, items: [{', '.join([f'*l{n - 1}'] * 9)}]}}")
    text = "kind: List\nx:\n" + "".join(f"  {line}\n" for line in lines) + "items: [*l9]\n"
    assert len(text) < 2000
    with pytest.raises(CliError) as refused:
        parse_documents(text, "bomb.yaml")
    assert "more than 10000 objects in one file" in refused.value.message
    assert refused.value.exit_code == 2


def test_an_invalid_spec_names_the_first_errors_and_counts_the_rest() -> None:
    """Every one of a thousand errors went into one line (an answer many times its input)."""
    with pytest.raises(CliError) as exc:
        load_manifests_from([pool(**{f"k{i}": 0 for i in range(1000)})])
    assert exc.value.message.count("unknown field") == 20
    assert exc.value.message.endswith("and 980 more (fix these first)")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"kind: GpuType\nname: caf\xe9\n", "not UTF-8 text"),  # latin-1
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe", "not UTF-8 text"),  # a binary
        (b"kind: GpuType\nname: a\x01b\n", "not valid YAML"),  # a control character
    ],
    ids=["latin-1", "binary", "control-character"],
)
def test_a_file_that_is_not_yaml_text_is_one_line_with_exit_2(
    tmp_path, content: bytes, says: str
) -> None:
    """These were a traceback and exit 1 (which `diff` documents as "a difference")."""
    from controlplane.cli.resources import _read

    path = tmp_path / "fleet.yaml"
    path.write_bytes(content)
    with pytest.raises(CliError) as refused:
        _read(str(path))
    assert says in refused.value.message and refused.value.exit_code == 2


def test_a_closed_stdin_is_one_line(monkeypatch) -> None:
    import sys

    from controlplane.cli.resources import _read

    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(CliError, match="stdin is closed"):
        _read("-")
