"""What a Prometheus needs to scrape the local fleet: a configuration and file-based service
discovery (``file_sd``) target lists, written under ``<data dir>/prometheus/``.

``prometheus.yml`` names one job per kind of process, each reading its targets from
``targets/<job>.json``; `gpufleet up` rewrites those files whenever what runs changes (a
cluster created with an ``endpoint`` joins the ``router`` job at the next refresh, a deleted
one leaves it), and Prometheus re-reads them by itself: no reload. Pure: targets in, text out;
``write`` only writes when a file's content changed (Prometheus watches them).

    prometheus --config.file=.gpufleet/prometheus/prometheus.yml
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

JOBS = ("api", "bus", "worker", "agent", "router", "gateway", "replica")
"""One scrape job per kind of process (the ``job`` label)."""


@dataclass(frozen=True)
class Target:
    address: str
    """``host:port`` whose ``/metrics`` is scraped."""
    labels: Mapping[str, str]
    """Extra labels on every series of this target (``cluster``, ``gateway``, ``region``)."""


def address_of(url: str) -> str:
    """``http://host:port/v1`` → ``host:port``."""
    return url.split("://", 1)[-1].split("/", 1)[0]


def file_sd(targets: Sequence[Target]) -> str:
    """One job's target list in Prometheus' file_sd JSON format (a group per target)."""
    groups = [
        {"targets": [t.address], "labels": dict(sorted(t.labels.items()))}
        for t in sorted(targets, key=lambda t: (t.address, sorted(t.labels.items())))
    ]
    return json.dumps(groups, indent=1) + "\n"


TOKEN_FILE = "token"
"""In the directory: the viewer token Prometheus sends to the API's ``/metrics``."""


def config(directory: Path, scrape_interval_s: int = 5) -> str:
    """``prometheus.yml``: every job reads ``targets/<job>.json`` (refreshed every 5 s); the
    API's job sends the token in ``token`` (the API's /metrics needs one)."""
    lines = [
        "# written by `gpufleet up` (controlplane/local/prometheus.py): scrape the local fleet",
        "global:",
        f"  scrape_interval: {scrape_interval_s}s",
        f"  evaluation_interval: {scrape_interval_s}s",
        "scrape_configs:",
    ]
    for job in JOBS:
        lines += [f"  - job_name: gpufleet-{job}"]
        if job == "api":
            lines += [
                "    authorization:",
                "      type: Bearer",
                f"      credentials_file: '{directory / TOKEN_FILE}'",
            ]
        lines += [
            "    file_sd_configs:",
            f"      - files: ['{directory / 'targets' / f'{job}.json'}']",
            "        refresh_interval: 5s",
        ]
    return "\n".join(lines) + "\n"


def write(directory: Path, jobs: Mapping[str, Sequence[Target]]) -> list[str]:
    """Write the configuration and every job's targets; returns the jobs whose targets
    changed (their file rewritten). A job left out of ``jobs`` gets an empty list."""
    (directory / "targets").mkdir(parents=True, exist_ok=True)
    _replace(directory / "prometheus.yml", config(directory))
    changed = []
    for job in JOBS:
        if _replace(directory / "targets" / f"{job}.json", file_sd(jobs.get(job, ()))):
            changed.append(job)
    return changed


def _replace(path: Path, text: str) -> bool:
    """Write ``text`` atomically if it differs from what is there; True if written."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True
