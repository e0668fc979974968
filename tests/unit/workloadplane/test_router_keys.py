"""The data path's API keys file (`gpufleet router|gateway --api-keys-file`): what it takes,
how a bad one is refused (naming the entry and what to change, never echoing a key), and
that keys are held only as digests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workloadplane.cli import app
from workloadplane.router.keys import KeyGrant, KeysFileError, hash_key, load_keys, parse_keys

SECRET = "sk-live-0123456789"


def keys(data: object) -> dict[str, KeyGrant]:
    return parse_keys(json.dumps(data).encode(), "keys.json")


def test_keys_are_held_as_digests_with_their_tier_and_residency():
    digest = hash_key("other-key")
    got = keys({SECRET: {"tier": 0, "jurisdictions": ["de", "FR"]}, f"sha256:{digest}": {}})
    assert got == {
        hash_key(SECRET): KeyGrant(0, frozenset({"DE", "FR"})),
        digest: KeyGrant(1, frozenset()),  # the defaults: tier 1, any jurisdiction
    }
    assert all(SECRET not in k for k in got)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([SECRET], "a JSON object of key → grant, not list"),
        ({SECRET: 0}, 'the grant is an object like {"tier": 1}, not int'),
        ({SECRET: {"tier": "gold"}}, "tier is an integer 0 to 2"),
        ({SECRET: {"tier": True}}, "tier is an integer 0 to 2"),
        ({SECRET: {"tier": 3}}, "tier is an integer 0 to 2"),
        ({SECRET: {"teir": 0}}, "unknown field 'teir'; a grant has tier, jurisdictions"),
        ({SECRET: {"jurisdictions": "DE"}}, 'jurisdictions is a list of country codes like ["DE"]'),
        ({SECRET: {"jurisdictions": ["Germany"]}}, "jurisdictions is a list of country codes"),
        ({"": {}}, "a key is 1 to 4096 characters"),
        ({SECRET + " ": {}}, "a key has no spaces or control characters"),
        ({SECRET + "\u0000": {}}, "a key has no spaces or control characters"),
        ({"sha256:abc": {}}, "after 'sha256:' give the key's 64 hex digits"),
        ({SECRET: {}, f"sha256:{hash_key(SECRET)}": {}}, "entry 2 (sha256:"),
        ({SECRET: {}, f"SHA256:{hash_key(SECRET)}": {}}, "the same key is given twice"),
        ({}, "names no key; give at least one (to run without keys, leave the option out)"),
        ({SECRET: {"jurisdictions": ["ß"]}}, "jurisdictions is a list of country codes"),
        ({f"sha256:{SECRET}": {}}, "after 'sha256:' give the key's 64 hex digits"),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry_and_what_to_change(data, says):
    with pytest.raises(KeysFileError) as err:
        keys(data)
    assert says in str(err.value)
    assert str(err.value).startswith("keys.json")
    assert SECRET not in str(err.value)  # a key is never echoed


def test_a_key_given_twice_is_refused_not_merged():
    raw = f'{{"{SECRET}": {{"tier": 0}}, "{SECRET}": {{"tier": 2}}}}'.encode()
    with pytest.raises(KeysFileError, match="given twice") as err:
        parse_keys(raw, "keys.json")
    assert SECRET not in str(err.value)
    with pytest.raises(KeysFileError, match="given twice"):
        parse_keys(f'{{"{SECRET}": {{"tier": 0, "tier": 2}}}}'.encode(), "keys.json")


def test_the_bearer_token_is_read_without_the_blanks_http_allows_around_it():
    from workloadplane.router.front import bearer, grant_of

    grants = keys({SECRET: {"tier": 0}})
    for auth in (f"Bearer {SECRET}", f"bearer {SECRET} ", f"Bearer  {SECRET}\t"):
        assert grant_of(grants, auth.encode()) == KeyGrant(0, frozenset()), auth
    assert bearer(b"Bearer") == "" and bearer(b"Basic abc") == ""


def test_not_json_oversized_or_unreadable_files_are_refused(tmp_path: Path):
    with pytest.raises(KeysFileError, match="not JSON"):
        parse_keys(b"{'k': 1}", "keys.json")
    with pytest.raises(KeysFileError, match="not JSON"):
        parse_keys(b"[" * 100_000, "keys.json")  # nested past the parser's limit
    with pytest.raises(KeysFileError, match="over 1048576 bytes"):
        parse_keys(b" " * (1024 * 1024 + 1), "keys.json")
    with pytest.raises(KeysFileError, match=r"cannot read the API keys file \(no such file\)"):
        load_keys(tmp_path / "missing.json")
    with pytest.raises(
        KeysFileError, match=r"cannot read the API keys file \(not a regular file\)"
    ):
        load_keys(Path("/dev/zero"))  # read whole, it would never end


@pytest.mark.parametrize("command", [["router"], ["gateway", "--name", "g", "--region", "r"]])
def test_router_and_gateway_exit_2_on_a_bad_keys_file_without_a_traceback(tmp_path, command):
    bad = tmp_path / "keys.json"
    bad.write_text(json.dumps({SECRET: {"tier": 9}}))
    result = CliRunner().invoke(app, [*command, "--api-keys-file", str(bad)])
    assert result.exit_code == 2
    assert "entry 1" in result.output and "tier is an integer 0 to 2" in result.output
    assert "--api-keys-file" in result.output
    assert SECRET not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
