"""The real `terraform` binary against a live API (uvicorn over the session's database, the
CLI suite's `api_url`), with the provider installed from a filesystem mirror written by the
provider's own `python -m gpufleet_tf.mirror`, as `make terraform-provider` does."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli.conftest import api_url  # noqa: F401 - the fixture, reused

ROOT = Path(__file__).resolve().parents[3]
TF_PYTHON = ROOT / "infra" / "terraform" / ".venv" / "bin" / "python"
SOURCE = "gpufleet.local/gpufleet/gpufleet"
HEADER = f"""terraform {{
  required_providers {{
    gpufleet = {{ source = "{SOURCE}" }}
  }}
}}
"""


def provider_module(name: str) -> Any:
    """One of the provider's standard-library modules (fields, kinds, connection), imported
    from its source: the main venv has no `tf`, and these need none."""
    source = str(ROOT / "infra" / "terraform")
    if source not in sys.path:
        sys.path.append(source)
    return importlib.import_module(f"gpufleet_tf.{name}")


@pytest.fixture(scope="session")
def terraform_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    terraform = shutil.which("terraform")
    assert terraform, "terraform is not on PATH (docs/terraform.md: install Terraform ≥ 1.5)"
    assert TF_PYTHON.exists(), f"{TF_PYTHON} is missing: run `make install`"
    root = tmp_path_factory.mktemp("terraform")
    mirror = root / "mirror"
    subprocess.run(
        [str(TF_PYTHON), "-m", "gpufleet_tf.mirror", "--dir", str(mirror), "--no-link"],
        check=True,
        capture_output=True,
    )
    config = root / "cli.tfrc"
    code = "from gpufleet_tf.mirror import cli_config; import sys; print(cli_config(sys.argv[1]))"
    config.write_text(
        subprocess.run(
            [str(TF_PYTHON), "-c", code, str(mirror)], check=True, capture_output=True, text=True
        ).stdout
    )
    return {
        "TF_CLI_CONFIG_FILE": str(config),
        "GPUFLEET_TF_PYTHON": str(TF_PYTHON),
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
        "NO_COLOR": "1",
    }


class Terraform:
    """`terraform …` in one working directory, as one API token."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env

    def write(self, hcl: str) -> None:
        (self.workdir / "main.tf").write_text(HEADER + hcl)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["terraform", *args, "-no-color"] if args[0] != "version" else ["terraform", *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"terraform {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def apply(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self("apply", "-auto-approve", "-input=false", *args)

    def plan_exit(self, *args: str) -> tuple[int, str]:
        """`plan -detailed-exitcode`: 0 no changes, 2 changes (1 is a failure here)."""
        result = self("plan", "-detailed-exitcode", "-input=false", *args, check=False)
        assert result.returncode in (0, 2), result.stdout + result.stderr
        return result.returncode, result.stdout

    def state(self) -> dict[str, dict[str, Any]]:
        """Each resource's attributes by address, from the local state file (reading it costs
        no terraform launch, which costs ~1 s)."""
        state = json.loads((self.workdir / "terraform.tfstate").read_text())
        found = {}
        for r in state["resources"]:
            if r["mode"] != "managed":
                continue
            for instance in r["instances"]:
                key = instance.get("index_key")
                index = "" if key is None else f"[{json.dumps(key)}]"
                found[f"{r['type']}.{r['name']}{index}"] = instance["attributes"]
        return found

    def output(self, name: str) -> Any:
        state = json.loads((self.workdir / "terraform.tfstate").read_text())
        return state["outputs"][name]["value"]


@pytest.fixture
def terraform(
    api_url: str,  # noqa: F811 - the reused fixture
    tokens: dict[str, str],
    terraform_env: dict[str, str],
    tmp_path: Path,
) -> Terraform:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "TF_"))},
        **terraform_env,
        "GPUFLEET_URL": api_url,
        "GPUFLEET_TOKEN": tokens["admin"],
        "GPUFLEET_CONFIG": str(tmp_path / "no-login.yaml"),
    }
    workdir = tmp_path / "work"
    workdir.mkdir()
    return Terraform(workdir, env)


class Api:
    """The admin API as an out-of-band operator sees it."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}
        )

    def get(self, path: str) -> Any:
        response = self.http.get(path)
        response.raise_for_status()
        return response.json()

    def names(self, path: str) -> list[str]:
        return sorted(i["name"] for i in self.get(f"/{path}?limit=500")["items"])

    def patch(self, path: str, changes: dict[str, Any]) -> Any:
        response = self.http.patch(path, json=changes)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.http.post(path, json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def delete(self, path: str) -> None:
        response = self.http.delete(path)
        assert response.status_code == 204, response.text


@pytest.fixture
def api(api_url: str, tokens: dict[str, str]) -> Iterator[Api]:  # noqa: F811
    client = Api(api_url, tokens["admin"])
    yield client
    client.http.close()
