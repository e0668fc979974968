"""A live `gpufleet up` fleet and Debian's Chromium driven by Playwright, for the dashboard's
browser tests. Chromium is installed with apt when missing; it starts headless with a fresh
profile and no background networking (this machine refuses connections to the outside)."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from controlplane.local.ports import free_port_block
from tests.integration.debian import installed
from tests.integration.test_up import READY, Up, _wait_until

REPO = Path(__file__).resolve().parents[3]
SHOTS = REPO / ".dashboard-shots"
AXE = REPO / "controlplane" / "dashboard" / "assets" / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
CLUSTERS = ("euc1-a", "local-a", "use1-a")


def chromium() -> str:
    return installed("chromium")


@dataclass
class Fleet:
    up: Up
    url: str
    token: str
    data_dir: Path
    gateways: dict[str, str]
    """name → base URL of the fleet's two global gateways"""
    api: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.api = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=15
        )

    def make_token(self, name: str, role: str) -> str:
        answer = self.api.post("/api/v1/tokens", json={"name": name, "role": role})
        assert answer.status_code == 201, answer.text
        return answer.json()["token"]


@pytest.fixture(scope="package")
def fleet() -> Iterator[Fleet]:

    first = free_port_block(40)
    names = ("api", "postgres", "nats", "redis", "router_base")
    ports = {name: first + i for i, name in enumerate(names)} | {"gateway_base": first + 8}
    root = Path(tempfile.mkdtemp(prefix="gpufleet-dash-"))
    data_dir = root / "fleet"
    up = Up(data_dir, ports, {"GPUFLEET_UP_STATUS_EVERY_S": "1", "GPUFLEET_API_WORKERS": "1"})
    try:
        up.wait_for(READY, 150)
        token = re.search(r"admin token \(shown once, keep it\): (gpf_\S+)", up.output)
        assert token, up.output
        gateways = {
            "use1": f"http://127.0.0.1:{first + 8}",
            "euc1": f"http://127.0.0.1:{first + 9}",
        }
        yield Fleet(up, up.api, token[1], data_dir, gateways)
    finally:
        up.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        # launch() gives Chromium a fresh temporary profile (user-data dir) and removes it after
        found = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        yield found
        found.close()


class Watched:
    """A page whose console errors and failed requests are collected as they happen."""

    def __init__(self, context: BrowserContext, base: str) -> None:
        self.context, self.base = context, base
        self.page: Page = context.new_page()
        self.page.set_default_timeout(15_000)
        self.errors: list[str] = []
        self.page.on(
            "console",
            lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)
        self.page.on(
            "response",
            lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )

    def _failed(self, request: object) -> None:
        url, failure = getattr(request, "url", ""), getattr(request, "failure", "")
        if "ERR_ABORTED" in str(failure) and ("/live/feed" in url or url.endswith("/favicon.svg")):
            # the browser itself cancels these when the page navigates away: the event stream,
            # and the icon, which is fetched after the page's load event (a missing icon
            # still shows up as a 404 response)
            return
        self.errors.append(f"failed {url}: {failure}")

    def login(self, token: str) -> None:
        self.page.goto(self.base + "/login")
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(self.base + "/")

    def violations(self) -> list[str]:
        """axe-core's serious and critical findings on the current page."""
        self.page.evaluate(
            AXE.read_text()
        )  # through the debugger: the page's CSP allows no inline script
        found = self.page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
            ".filter(v => ['serious', 'critical'].includes(v.impact))"
            ".map(v => v.id + ': ' + v.help + ' @ ' + v.nodes.map(n => n.target.join(' ')).slice(0, 3).join(', '))"
        )
        return list(found)


def wait_until(check: object, timeout_s: float, what: str) -> None:
    _wait_until(check, timeout_s, what)  # type: ignore[arg-type]
