"""NATS credentials: generated from the OS CSPRNG, stored only as bcrypt hashes.

No I/O and no nats-py: the API mints a cluster's credentials when the cluster is created
(shown once); `controlplane.bus.credentials` renders the hashes into the nats-server config.
"""

from __future__ import annotations

import secrets

import bcrypt

from controlplane.contracts import (
    NatsCredentials,
    cluster_inbox_prefix,
    cluster_user,
    gateway_inbox_prefix,
    gateway_user,
)

CONTROLPLANE_USER = "controlplane"


def generate_password() -> str:
    """256 bits from the OS CSPRNG, URL-safe (no quoting issues in the config file)."""
    return secrets.token_urlsafe(32)


def generate_cluster_credentials(cluster: str) -> NatsCredentials:
    """New credentials for a cluster; show them once, keep them in the server config only."""
    return NatsCredentials(
        user=cluster_user(cluster),
        password=generate_password(),
        inbox_prefix=cluster_inbox_prefix(cluster),
    )


def generate_gateway_credentials(gateway: str) -> NatsCredentials:
    """New read-only credentials for a gateway (`controlplane.bus.gateway_permissions`)."""
    return NatsCredentials(
        user=gateway_user(gateway),
        password=generate_password(),
        inbox_prefix=gateway_inbox_prefix(gateway),
    )


def generate_controlplane_credentials() -> NatsCredentials:
    return NatsCredentials(user=CONTROLPLANE_USER, password=generate_password())


BCRYPT_ROUNDS = 10
"""nats-server checks the hash on every (re)connect: ~50 ms at cost 10."""


def hash_password(password: str, rounds: int = BCRYPT_ROUNDS) -> str:
    """bcrypt hash in the ``$2a$`` form nats-server recognises."""
    salt = bcrypt.gensalt(rounds=rounds, prefix=b"2a")
    return bcrypt.hashpw(password.encode(), salt).decode()
