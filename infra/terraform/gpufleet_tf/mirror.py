"""Writes the provider into a Terraform filesystem mirror (packed layout), so that
`terraform init` installs it offline and records it in `.terraform.lock.hcl`.

The archive holds a small POSIX shell launcher, the same bytes on every machine (so the lock
file's hash is the same for a whole team), not pip's shim with its absolute shebang: it runs
`$GPUFLEET_TF_PYTHON -m gpufleet_tf`, else the virtual environment that
`make terraform-provider` links at `${XDG_DATA_HOME:-~/.local/share}/gpufleet/terraform-provider/venv`.

    python -m gpufleet_tf.mirror [--dir MIRROR] [--link VENV]
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from pathlib import Path

from gpufleet_tf import PROVIDER_ADDRESS, VERSION

TYPE = PROVIDER_ADDRESS.rsplit("/", 1)[1]
TARGETS = ("linux_amd64", "linux_arm64", "darwin_amd64", "darwin_arm64")

LAUNCHER = """#!/bin/sh
# terraform-provider-gpufleet: runs the provider (Python, PyPI tf) from GPUFLEET_TF_PYTHON,
# else from the virtual environment `make terraform-provider` linked below.
python="${GPUFLEET_TF_PYTHON:-${XDG_DATA_HOME:-$HOME/.local/share}/gpufleet/terraform-provider/venv/bin/python}"
if [ ! -x "$python" ]; then
  echo "terraform-provider-gpufleet: no Python at $python; run 'make terraform-provider' in your gpufleet checkout, or set GPUFLEET_TF_PYTHON" >&2
  exit 1
fi
exec "$python" -m gpufleet_tf "$@"
"""


def default_mirror() -> Path:
    """Terraform's implied local mirror: no CLI configuration needed."""
    return Path.home() / ".terraform.d" / "plugins"


def default_link() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpufleet" / "terraform-provider" / "venv"


def archive_bytes() -> bytes:
    """One zip, byte for byte the same on every run (fixed time stamp and mode)."""
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo(f"terraform-provider-{TYPE}_v{VERSION}", (1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o100755 & 0xFFFF) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, LAUNCHER)
    return buffer.getvalue()


def write_mirror(mirror: Path) -> list[Path]:
    directory = mirror / PROVIDER_ADDRESS
    directory.mkdir(parents=True, exist_ok=True)
    data = archive_bytes()
    written = []
    for target in TARGETS:
        path = directory / f"terraform-provider-{TYPE}_{VERSION}_{target}.zip"
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        written.append(path)
    return written


def link_venv(link: Path, venv: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        if link.is_symlink() and Path(os.readlink(link)) == venv:
            return
        link.unlink()
    link.symlink_to(venv, target_is_directory=True)


def cli_config(mirror: Path) -> str:
    """A CLI configuration that installs gpufleet from `mirror` and others as usual."""
    host = PROVIDER_ADDRESS.split("/")[0]
    return (
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{mirror}"\n    include = ["{host}/*/*"]\n  }}\n'
        f'  direct {{\n    exclude = ["{host}/*/*"]\n  }}\n'
        "}\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the gpufleet provider into a mirror.")
    parser.add_argument("--dir", type=Path, default=default_mirror(), help="the mirror")
    parser.add_argument(
        "--link", type=Path, default=default_link(), help="where the launcher finds the venv"
    )
    parser.add_argument("--no-link", action="store_true", help="leave the venv link alone")
    args = parser.parse_args(argv)
    paths = write_mirror(args.dir)
    print(f"provider {PROVIDER_ADDRESS} {VERSION} in {paths[0].parent}")
    if not args.no_link:
        venv = Path(sys.prefix)
        link_venv(args.link, venv)
        print(f"launcher runs {args.link} -> {venv}")


if __name__ == "__main__":
    main()
