"""API keys of the data path (a plane's router, a gateway): what each may do, held only as
SHA-256 digests, and the keys file both read (``--api-keys-file``).

The file is JSON ``{"<key or sha256:HEX>": {"tier": 0-2, "jurisdictions": ["DE"]}}``. A
file that does not say exactly that is refused as a whole with a message naming the entry
and what to change; a key itself is never echoed (an entry is named by its place in the
file and, for a well-formed ``sha256:`` entry, the first characters of its digest). A file
that names no key is refused too: it must not turn authentication off.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.contracts import read_small_file

MAX_FILE_BYTES = 1024 * 1024
MAX_KEY_CHARS = 4096
_DIGEST = re.compile(r"[0-9a-f]{64}")
_COUNTRY = re.compile(r"[A-Z]{2}")
_FIELDS = {"tier", "jurisdictions"}


@dataclass(frozen=True, slots=True)
class KeyGrant:
    """What one API key may do: its best tier and (at a gateway) its residency."""

    tier: int = 1
    jurisdictions: frozenset[str] = frozenset()


class KeysFileError(ValueError):
    """The keys file is not what ``load_keys`` takes; the message says what to change."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()


def load_keys(path: Path, *, tiers: int = 3) -> dict[str, KeyGrant]:
    """sha256 hex of each key → its grant, from the keys file at ``path``."""
    try:
        raw = read_small_file(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise KeysFileError(f"{path}: cannot read the API keys file ({exc.strerror})") from None
    return parse_keys(raw, str(path), tiers=tiers)


class _Repeated(ValueError):
    pass


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a name given twice in one object is refused (json.loads would
    keep the last, so a key listed twice with two tiers got the second silently)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        raise _Repeated
    return out


def parse_keys(raw: bytes, where: str, *, tiers: int = 3) -> dict[str, KeyGrant]:
    if len(raw) > MAX_FILE_BYTES:
        raise KeysFileError(f"{where}: over {MAX_FILE_BYTES} bytes; split the keys up")
    try:
        data = json.loads(raw, object_pairs_hook=_once)
    except _Repeated:
        raise KeysFileError(
            f"{where}: a key (or a grant's field) is given twice; give each once"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise KeysFileError(
            f"{where}: not JSON ({exc}); write "
            '{"<key or sha256:HEX>": {"tier": 0, "jurisdictions": ["DE"]}}'
        ) from None
    if not isinstance(data, dict):
        raise KeysFileError(f"{where}: a JSON object of key → grant, not {_kind(data)}")
    if not data:  # an empty file must not turn authentication off
        raise KeysFileError(
            f"{where}: names no key; give at least one (to run without keys, leave the option out)"
        )
    keys: dict[str, KeyGrant] = {}
    for n, (key, grant) in enumerate(data.items(), start=1):
        name = f"{where}: entry {n}"
        digest = _digest(key, name)
        if key[:7].lower() == "sha256:":  # a digest is no secret: its start names the entry
            name += f" (sha256:{digest[:8]}…)"
        if digest in keys:
            raise KeysFileError(f"{name}: the same key is given twice")
        keys[digest] = _grant(grant, name, tiers)
    return keys


def _digest(key: str, name: str) -> str:
    if not key or len(key) > MAX_KEY_CHARS:
        raise KeysFileError(f"{name}: a key is 1 to {MAX_KEY_CHARS} characters")
    if key[:7].lower() == "sha256:":
        digest = key[7:].lower()
        if not _DIGEST.fullmatch(digest):
            raise KeysFileError(f"{name}: after 'sha256:' give the key's 64 hex digits")
        return digest
    if not key.isprintable() or any(c.isspace() for c in key):
        raise KeysFileError(f"{name}: a key has no spaces or control characters")
    return hash_key(key)


def _grant(grant: Any, name: str, tiers: int) -> KeyGrant:
    if not isinstance(grant, dict):
        raise KeysFileError(
            f'{name}: the grant is an object like {{"tier": 1}}, not {_kind(grant)}'
        )
    unknown = sorted(set(grant) - _FIELDS)
    if unknown:
        raise KeysFileError(
            f"{name}: unknown field {unknown[0]!r}; a grant has tier, jurisdictions"
        )
    tier = grant.get("tier", 1)
    if type(tier) is not int or not 0 <= tier < tiers:
        raise KeysFileError(f"{name}: tier is an integer 0 to {tiers - 1} (0 the highest)")
    codes = grant.get("jurisdictions", [])
    if not isinstance(codes, list) or not all(
        isinstance(c, str) and c.isascii() and _COUNTRY.fullmatch(c.upper()) for c in codes
    ):
        raise KeysFileError(f'{name}: jurisdictions is a list of country codes like ["DE"]')
    return KeyGrant(tier, frozenset(c.upper() for c in codes))


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
