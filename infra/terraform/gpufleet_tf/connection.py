"""Where the provider finds the control plane, with the CLI's precedence (docs/cli.md):
the provider block's `url`/`token`, then GPUFLEET_URL/GPUFLEET_TOKEN, then the CLI's login file
(`$GPUFLEET_CONFIG`, else `$XDG_CONFIG_HOME/gpufleet/config.yaml`, else
`~/.config/gpufleet/config.yaml`), then http://127.0.0.1:8080.

A copy of `controlplane.cli.config.load_context`'s lookup, not an import of it: the main package
would drag the control plane's dependencies into this venv. tests/integration/terraform checks
that both agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"


class ConnectionError_(Exception):  # noqa: N801 - not the builtin ConnectionError
    """The login file cannot be read; the message says how to fix it."""


@dataclass(frozen=True)
class Connection:
    url: str
    token: str | None


def config_path(env: Mapping[str, str]) -> Path:
    configured = env.get("GPUFLEET_CONFIG")
    if configured:
        return Path(configured).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpufleet" / "config.yaml"


def read_login(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    import yaml  # only when there is a login file: it costs the provider's start-up

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConnectionError_(
            f"cannot read {path}: {exc}; fix it or run `gpufleet login` again"
        ) from exc
    except yaml.YAMLError as exc:  # never the file's text (the error quotes it): the token
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise ConnectionError_(
            f"cannot read {path}: {problem}{where}; fix it or run `gpufleet login` again"
        ) from None
    if not isinstance(data, dict):
        raise ConnectionError_(f"{path} is not a mapping; delete it and run `gpufleet login` again")
    return {k: str(v) for k, v in data.items() if k in ("url", "token") and v}


def resolve(url: str | None, token: str | None, env: Mapping[str, str] | None = None) -> Connection:
    """The provider block overrides the environment, which overrides the login file."""
    env = os.environ if env is None else env
    stored = read_login(config_path(env))
    found_url = url or env.get("GPUFLEET_URL") or stored.get("url") or DEFAULT_URL
    found_token = token or env.get("GPUFLEET_TOKEN") or stored.get("token") or None
    return Connection(found_url.rstrip("/"), found_token)
