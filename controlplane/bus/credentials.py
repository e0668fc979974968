"""The nats-server authorization config: who may read and publish what.

Credentials are generated and hashed in `controlplane.credentials` (no nats-py there, so the
API can mint a cluster's credentials); this module renders them into the server config.

A cluster may read only its own desired-state key and publish only its own
``gpufleet.v1.cluster.<name>.…`` subjects; a gateway may only read the routing table and
listen to the planes' load reports; the control plane user may do anything.
The config file holds bcrypt hashes of the passwords (nats-server checks them), never the
passwords themselves; it is still written mode 0600.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from controlplane.contracts import (
    DESIRED_BUCKET,
    DESIRED_STREAM,
    FACT_TYPE_NAMES,
    MAX_REPORT_BYTES,
    PLANE_LOAD_SUBJECTS,
    ROUTES_STREAM,
    ROUTES_SUBJECT,
    NatsCredentials,
    cluster_inbox_prefix,
    desired_subject,
    fact_subject,
    gateway_inbox_prefix,
    observed_subject,
    plane_load_subject,
)
from controlplane.credentials import (
    CONTROLPLANE_USER,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    generate_gateway_credentials,
    hash_password,
)

__all__ = [
    "CONTROLPLANE_USER",
    "NatsPermissions",
    "cluster_permissions",
    "gateway_permissions",
    "generate_cluster_credentials",
    "generate_controlplane_credentials",
    "generate_gateway_credentials",
    "hash_password",
    "render_server_config",
    "write_server_config",
]


@dataclass(frozen=True)
class NatsPermissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def cluster_permissions(cluster: str) -> NatsPermissions:
    """Least privilege for one cluster's agent.

    Reading its key: the agent creates a consumer on the KV stream whose filter subject is
    its own key. The server checks that the filter named in the API subject
    (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``) equals the one in the request,
    so this grant cannot be used to watch another key. Direct get is granted only in its
    last-by-subject form for the agent's own key. Deliveries and API replies land on the
    cluster's own inbox prefix.
    """
    key_subject = desired_subject(cluster)
    return NatsPermissions(
        publish=(
            # its reports by name, not `<prefix>.>`: each subject has its own share of the
            # reports stream (REPORTS_PER_SUBJECT), and a plane inventing fact subjects would
            # have had as many shares as names it made up
            observed_subject(cluster),
            *(fact_subject(cluster, name) for name in FACT_TYPE_NAMES),
            plane_load_subject(cluster),
            f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.*.{key_subject}",
            f"$JS.API.DIRECT.GET.{DESIRED_STREAM}.{key_subject}",
        ),
        subscribe=(f"{cluster_inbox_prefix(cluster)}.>",),
    )


def gateway_permissions(gateway: str) -> NatsPermissions:
    """Read-only for one gateway: the routing table (a consumer filtered on its one key, and
    a direct get of it, as `cluster_permissions` grants a cluster its desired key) and every
    plane's load reports (core NATS). It publishes nothing else — no report, no KV write,
    no other stream's API — and its replies land on its own inbox prefix."""
    return NatsPermissions(
        publish=(
            f"$JS.API.CONSUMER.CREATE.{ROUTES_STREAM}.*.{ROUTES_SUBJECT}",
            f"$JS.API.DIRECT.GET.{ROUTES_STREAM}.{ROUTES_SUBJECT}",
        ),
        subscribe=(PLANE_LOAD_SUBJECTS, f"{gateway_inbox_prefix(gateway)}.>"),
    )


def _quote(value: str) -> str:
    return json.dumps(value)


def _render_user(creds: NatsCredentials, perms: NatsPermissions | None) -> str:
    # Already a bcrypt hash (what the control plane stores for clusters): use it as is.
    hashed = creds.password if creds.password.startswith("$2") else hash_password(creds.password)
    lines = [f"    {{ user: {_quote(creds.user)}, password: {_quote(hashed)}"]
    if perms is not None:
        pub = ", ".join(_quote(s) for s in perms.publish)
        sub = ", ".join(_quote(s) for s in perms.subscribe)
        lines.append(f"      permissions: {{ publish: {{ allow: [{pub}] }},")
        lines.append(f"                     subscribe: {{ allow: [{sub}] }} }}")
    lines.append("    }")
    return "\n".join(lines)


def render_server_config(
    *,
    controlplane: NatsCredentials,
    clusters: dict[str, NatsCredentials],
    store_dir: Path | str,
    port: int = 4222,
    host: str = "127.0.0.1",
    gateways: dict[str, NatsCredentials] | None = None,
) -> str:
    """The full nats-server config: JetStream store dir, listen address and every user
    (``gateways``: gateway name -> its credentials, user ``gateway_user(name)``)."""
    users = [_render_user(controlplane, None)]
    for name in sorted(clusters):
        users.append(_render_user(clusters[name], cluster_permissions(name)))
    for name in sorted(gateways or {}):
        users.append(_render_user((gateways or {})[name], gateway_permissions(name)))
    return (
        "# Generated by gpufleet; passwords are bcrypt hashes. Keep mode 0600.\n"
        f"host: {_quote(host)}\n"
        f"port: {port}\n"
        f"max_payload: {MAX_REPORT_BYTES}\n"  # a plane's heartbeat may be this large
        f"jetstream {{ store_dir: {_quote(str(store_dir))} }}\n"
        "authorization {\n"
        "  users = [\n" + "\n".join(users) + "\n  ]\n"
        "}\n"
        f"# desired-state bucket: {DESIRED_BUCKET}\n"
    )


def write_server_config(path: Path, text: str) -> Path:
    """Write the config readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path
