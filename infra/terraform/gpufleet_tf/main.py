"""The provider process's composition root: Terraform starts it (2–3 times per command) and
speaks gRPC to it, so start-up time is most of a command's time."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

CERT_CACHE = Path.home() / ".cache" / "tf-python-provider" / "ssl_cert.json"
CERT_REUSE_S = 6 * 86400
"""tf makes a 7-day certificate and caches it; reuse it for 6 days without parsing it."""


def cached_certificate(cache: Path = CERT_CACHE, now: float | None = None) -> Any:
    """tf's AutoMTLS certificate from its cache while it is fresh, else None.

    tf's own loader imports `cryptography` to read the expiry of a certificate it made
    itself, which doubles the provider's start-up (0.4–0.6 s measured here); the cache file's
    age says the same (tf writes it when it makes the certificate)."""
    try:
        age = (time.time() if now is None else now) - cache.stat().st_mtime
        if age > CERT_REUSE_S:
            return None
        cached = json.loads(cache.read_text())
        return cached["key_pem"].encode(), cached["cert_pem"].encode(), cached["cert_chain"]
    except (OSError, ValueError, KeyError):
        return None


def main() -> None:
    import grpc
    from tf import runner

    from gpufleet_tf.provider import GpufleetProvider

    make_certificate = runner._self_signed_cert  # pyright: ignore[reportPrivateUsage]

    def certificate() -> tuple[bytes, Any]:
        found = cached_certificate()
        if found is None:
            return make_certificate()
        key_pem, cert_pem, chain = found
        credentials = grpc.ssl_server_credentials(
            private_key_certificate_chain_pairs=[(key_pem, cert_pem)], require_client_auth=False
        )
        return base64.b64decode(chain), credentials

    runner._self_signed_cert = certificate  # pyright: ignore[reportPrivateUsage]
    runner.run_provider(GpufleetProvider(), sys.argv)
