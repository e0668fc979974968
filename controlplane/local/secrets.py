"""Credentials the local fleet itself needs: the control plane's NATS user and the demo
clusters' (plain, each in a 0600 file under DATA_DIR/secrets/), and every cluster's NATS user
with its stored bcrypt hash for the server config."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cluster_users(database_url: str) -> dict[str, Any]:
    """Cluster name → NatsCredentials carrying the stored bcrypt hash (never a password)."""
    from sqlalchemy import select

    from controlplane.contracts import NatsCredentials
    from controlplane.db.models import Cluster
    from controlplane.db.session import make_engine, make_session_factory

    engine = make_engine(database_url, pool_size=1)
    try:
        with make_session_factory(engine)() as session:
            rows = session.execute(
                select(Cluster.name, Cluster.nats_user, Cluster.nats_password_hash)
            ).all()
    finally:
        engine.dispose()
    return {
        name: NatsCredentials(user=user, password=hashed)
        for name, user, hashed in rows
        if user and hashed
    }


def _credentials(path: Path) -> Any:
    """The NatsCredentials in ``path``; a broken file is named, its text never shown (a
    validation error quotes the input: the password)."""
    from pydantic import ValidationError

    from controlplane.contracts import NatsCredentials
    from controlplane.local.supervisor import UpError

    try:
        return NatsCredentials.model_validate_json(path.read_text())
    except (ValidationError, OSError, UnicodeDecodeError):
        raise UpError(
            f"{path} is not a credentials file (damaged?): delete it and start again, "
            "or stop the fleet and remove its data directory"
        ) from None


class Secrets:
    """Plain credentials the local fleet itself needs, each in a 0600 file under secrets/."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _write(self, name: str, data: dict[str, str]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        path = self.root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        return path

    def controlplane(self) -> Any:
        from controlplane.bus.credentials import generate_controlplane_credentials

        path = self.root / "nats-controlplane.json"
        if not path.exists():
            creds = generate_controlplane_credentials()
            self._write(path.name, {"user": creds.user, "password": creds.password})
        return _credentials(path)

    def save_admin_token(self, token: str) -> Path:
        """The admin token `up` made at the first start, kept at once: a start that fails
        after making it (a port that did not open in time) lost it for good before."""
        return self._write("admin-token.json", {"token": token})

    @property
    def admin_token_path(self) -> Path:
        return self.root / "admin-token.json"

    def save_cluster(self, cluster: str, creds: dict[str, str]) -> Path:
        return self._write(f"cluster-{cluster}.json", creds)

    def clusters(self) -> dict[str, Path]:
        if not self.root.exists():
            return {}
        return {
            p.stem.removeprefix("cluster-"): p for p in sorted(self.root.glob("cluster-*.json"))
        }

    def gateway(self, name: str) -> tuple[Path, Any]:
        """A demo gateway's NATS credentials file and credentials (made on first use)."""
        import secrets

        from controlplane.contracts import gateway_inbox_prefix, gateway_user

        path = self.root / f"gateway-{name}.json"
        if not path.exists():
            self._write(
                path.name,
                {
                    "user": gateway_user(name),
                    "password": secrets.token_urlsafe(32),
                    "inbox_prefix": gateway_inbox_prefix(name),
                },
            )
        creds = _credentials(path)
        if creds.inbox_prefix != gateway_inbox_prefix(name):  # made before the prefix moved
            creds = creds.model_copy(update={"inbox_prefix": gateway_inbox_prefix(name)})
            self._write(path.name, creds.model_dump())
        return path, creds
