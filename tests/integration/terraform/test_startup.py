"""The provider reuses tf's cached AutoMTLS certificate without parsing it (start-up is most
of a terraform command's time) only while the cache is younger than the certificate."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.integration.terraform.conftest import provider_module

main = provider_module("main")


def _cache(tmp_path: Path, age_s: float) -> Path:
    cache = tmp_path / "ssl_cert.json"
    cache.write_text(json.dumps({"key_pem": "K", "cert_pem": "C", "cert_chain": "Q0hBSU4="}))
    written = cache.stat().st_mtime
    os.utime(cache, (written - age_s, written - age_s))
    return cache


def test_a_fresh_cache_is_reused(tmp_path: Path) -> None:
    assert main.cached_certificate(_cache(tmp_path, 3600)) == (b"K", b"C", "Q0hBSU4=")


def test_an_old_missing_or_broken_cache_leaves_it_to_tf(tmp_path: Path) -> None:
    assert main.cached_certificate(_cache(tmp_path, 6.5 * 86400)) is None
    assert main.cached_certificate(tmp_path / "missing.json") is None
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main.cached_certificate(broken) is None
