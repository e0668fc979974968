"""Where the CLI finds the control plane: flags, then GPUFLEET_URL/GPUFLEET_TOKEN, then the file.

The file (`~/.config/gpufleet/config.yaml`, or `$GPUFLEET_CONFIG`) holds a secret: it is
written with mode 0600 and the token is never printed back, only its prefix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.cli.manifests import CliError

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Context:
    url: str
    token: str | None
    source: str  # where url/token came from, for `gpufleet context`

    @property
    def token_prefix(self) -> str:
        return token_prefix(self.token)


def token_prefix(token: str | None) -> str:
    if not token:
        return "(none)"
    return token[:10] + "…" if len(token) > 10 else token[:3] + "…"


def config_path() -> Path:
    configured = os.environ.get("GPUFLEET_CONFIG")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpufleet" / "config.yaml"


def read_file(path: Path) -> dict[str, str]:
    try:
        if not path.exists():
            return {}
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:  # PermissionError too (a directory it may not enter)
        raise CliError(f"cannot read {path}: {exc}; fix it or run `gpufleet login` again") from exc
    except UnicodeDecodeError:
        raise CliError(
            f"cannot read {path}: it is not UTF-8 text; delete it and run `gpufleet login` again"
        ) from None
    except yaml.YAMLError as exc:  # one line, and never the file's text: it holds the token
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise CliError(
            f"cannot read {path}: {problem}{where}; fix it or run `gpufleet login` again"
        ) from None
    if not isinstance(data, dict):
        raise CliError(f"{path} is not a mapping; delete it and run `gpufleet login` again")
    return {k: str(v) for k, v in data.items() if k in ("url", "token") and v}


def load_context(url: str | None = None, token: str | None = None) -> Context:
    """Flags override the environment, which overrides the config file."""
    path = config_path()
    stored = read_file(path)
    url, url_from = _first(
        (url, "--url"),
        (os.environ.get("GPUFLEET_URL"), "GPUFLEET_URL"),
        (stored.get("url"), str(path)),
    )
    token, token_from = _first(
        (token, "--token"),
        (os.environ.get("GPUFLEET_TOKEN"), "GPUFLEET_TOKEN"),
        (stored.get("token"), str(path)),
    )
    sources = ", ".join(dict.fromkeys(s for s in (url_from, token_from) if s)) or "defaults"
    return Context((url or DEFAULT_URL).rstrip("/"), token, sources)


def _first(*candidates: tuple[str | None, str]) -> tuple[str | None, str | None]:
    for value, source in candidates:
        if value:
            return value, source
    return None, None


def save_context(url: str, token: str, path: Path | None = None) -> Path:
    """Write url and token, readable by the owner only (created 0600, never world-readable)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = yaml.safe_dump({"url": url.rstrip("/"), "token": token}, sort_keys=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # the file may have existed with a wider mode
        f.write(text)
    return path
