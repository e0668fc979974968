"""The dashboard in a real browser against a live `gpufleet up` fleet (docs/dashboard.md)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.integration.dashboard.conftest import SHOTS, Fleet, Watched, wait_until
from workloadplane.state import DesiredStateStore

pytestmark = pytest.mark.integration

PAGES = {
    "overview": "/",
    "map": "/map",
    "clusters": "/clusters",
    "pools": "/pools",
    "deployments": "/deployments",
    "deployment": "/deployments/triage-llm",
    "placement": "/placement",
    "events": "/events",
    "audit": "/events?log=audit",
    "playground": "/playground",
    "tokens": "/tokens",
}


def desired_quota(data_dir: Path, cluster: str, deployment: str) -> tuple[int, int] | None:
    """(min, max) of one deployment in the cluster's agent's newest desired state, read as the
    agent reads it (its two CRC-framed slot files)."""
    state = DesiredStateStore(data_dir / "agents" / cluster, fsync=False).load()
    for d in state.deployments if state is not None else []:
        if d.name == deployment:
            return d.quota.min, d.quota.max
    return None


def test_every_page_loads_clean_accessible_and_is_screenshotted(
    fleet: Fleet, browser: Browser
) -> None:
    SHOTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    problems: dict[str, list[str]] = {}
    for name, path in PAGES.items():
        watched.page.goto(fleet.url + path)
        expect(watched.page.locator("h1")).to_be_visible()
        if name not in ("overview", "events", "audit"):  # those keep their event stream open
            watched.page.wait_for_load_state("networkidle")
        found = watched.violations()
        if found:
            problems[name] = found
        watched.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    watched.page.goto(fleet.url + "/api/v1/docs")
    expect(watched.page.locator(".swagger-ui .authorize")).to_be_visible(timeout=30_000)
    watched.page.screenshot(path=str(SHOTS / "api-docs.png"))
    context.close()
    assert not watched.errors, watched.errors
    assert not problems, problems


def test_login_and_logout(fleet: Fleet, browser: Browser) -> None:
    context = browser.new_context()
    watched = Watched(context, fleet.url)
    page = watched.page
    page.goto(fleet.url + "/pools")
    assert page.url == fleet.url + "/login?next=/pools"
    page.fill("#token", "gpf_not-a-token")
    page.click("button[type=submit]")
    expect(page.locator(".problem")).to_contain_text("not valid")
    page.fill("#token", fleet.token)
    page.click("button[type=submit]")
    page.wait_for_url(fleet.url + "/pools")
    cookie = next(c for c in context.cookies() if c.get("name") == "gpufleet_session")
    assert cookie.get("httpOnly") and cookie.get("sameSite") == "Strict"
    page.click("text=Log out")
    page.wait_for_url(fleet.url + "/login")
    page.goto(fleet.url + "/")
    assert page.url.startswith(fleet.url + "/login")
    context.close()


def test_viewer_sees_no_write_controls_and_a_forged_write_is_refused(
    fleet: Fleet, browser: Browser
) -> None:
    context = browser.new_context()
    watched = Watched(context, fleet.url)
    watched.login(fleet.make_token("dash-viewer", "viewer"))
    page = watched.page
    page.goto(fleet.url + "/deployments/triage-llm")
    expect(page.locator("h1")).to_have_text("triage-llm")
    assert page.locator("form#autoscaling, button:has-text('Save')").count() == 0
    page.goto(fleet.url + "/tokens")
    assert page.locator("form[hx-post='/tokens'], button:has-text('Disable')").count() == 0
    status = page.evaluate(
        """async () => (await fetch('/deployments/triage-llm/autoscaling', {
            method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: new URLSearchParams({csrf: document.querySelector('meta[name=csrf-token]').content,
                                       generation: '1', min_replicas: '0', max_replicas: '9'})
        })).status"""
    )
    assert status == 403
    no_csrf = page.evaluate(
        "async () => (await fetch('/tokens', {method: 'POST', body: 'name=x&role=admin',"
        " headers: {'Content-Type': 'application/x-www-form-urlencoded'}})).status"
    )
    assert no_csrf == 403
    got = fleet.api.get("/api/v1/deployments/triage-llm").json()
    assert got["autoscaling"]["max_replicas"] != 9
    context.close()


def test_an_edit_round_trips_to_the_plane_and_a_stale_one_says_so(
    fleet: Fleet, browser: Browser
) -> None:
    context = browser.new_context()
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    page = watched.page
    page.goto(fleet.url + "/deployments/triage-llm")
    # the demo's use1-a plane has 8 GPUs: two 4-GPU replicas fit, one more would not
    page.fill("#min_replicas", "1")
    page.fill("#max_replicas", "1")
    page.click("button:has-text('Save')")
    expect(page.locator("#saved")).to_contain_text("1–1")
    got = fleet.api.get("/api/v1/deployments/triage-llm").json()
    assert got["autoscaling"]["max_replicas"] == 1
    wait_until(
        lambda: desired_quota(fleet.data_dir, "use1-a", "triage-llm") == (1, 1),
        60,
        "use1-a's desired state to give triage-llm min 1, max 1",
    )
    # a second tab's edit after this page was rendered: this one is now stale
    page.goto(fleet.url + "/deployments/triage-llm")
    changed = fleet.api.patch(
        "/api/v1/deployments/triage-llm", json={"autoscaling": {"max_replicas": 4}}
    )
    assert changed.status_code == 200, changed.text
    page.fill("#max_replicas", "5")
    page.click("button:has-text('Save')")
    expect(page.locator("#stale")).to_contain_text("Someone changed triage-llm")
    assert (
        fleet.api.get("/api/v1/deployments/triage-llm").json()["autoscaling"]["max_replicas"] == 4
    )
    context.close()


def test_the_event_feed_updates_without_a_reload(fleet: Fleet, browser: Browser) -> None:
    context = browser.new_context()
    # marks the page once the stream is open; read with a selector, not wait_for_function,
    # whose string evaluation the dashboard's Content-Security-Policy (no unsafe-eval) refuses
    context.add_init_script(
        "document.addEventListener('htmx:sseOpen', () => {"
        " document.documentElement.setAttribute('data-feed-open', '1'); })"
    )
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    page = watched.page
    page.wait_for_selector("html[data-feed-open]", state="attached")  # the stream is open
    before = page.locator("#feed .feed-row").count()
    made = fleet.api.post("/api/v1/tokens", json={"name": "feed-probe", "role": "viewer"})
    assert made.status_code == 201
    expect(page.locator("#feed .feed-row", has_text="feed-probe")).to_be_visible(timeout=15_000)
    assert page.locator("#feed .feed-row").count() > before
    context.close()


def test_the_playground_streams_tokens(fleet: Fleet, browser: Browser) -> None:
    context = browser.new_context()
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    page = watched.page

    def served() -> bool:
        page.goto(fleet.url + "/playground")
        return page.locator("#pg-target option[value^='gateway:']").count() > 0

    wait_until(served, 90, "a router to serve a deployment")
    options = page.locator("#pg-target option").evaluate_all("os => os.map(o => o.value)")
    through_gateway = options[0]  # the fleet's endpoint comes first
    through_router = next(o for o in options if not o.startswith("gateway:"))
    assert through_gateway.startswith("gateway:use1|") or through_gateway.startswith(
        "gateway:euc1|"
    ), options

    def streamed() -> bool:
        page.click("button:has-text('Send')")
        page.wait_for_selector("#pg-output[data-done=true]", timeout=30_000)
        return int(page.text_content("#pg-tokens") or "0") > 0

    for target in (through_router, through_gateway):
        page.select_option("#pg-target", target)
        wait_until(streamed, 90, f"a replica to stream an answer through {target}")
        assert (page.text_content("#pg-ttft") or "").endswith(" ms")
        assert float(page.text_content("#pg-tps") or "0") > 0
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "playground-streamed.png"))
    # the router counted it: the deployment's page shows its serving figures
    model = through_router.split("|")[1]
    page.goto(fleet.url + f"/deployments/{model}")
    expect(page.locator("#serving")).to_be_visible()
    assert int(page.text_content("#serving tbody td") or "0") >= 1
    page.screenshot(path=str(SHOTS / "deployment-serving.png"), full_page=True)
    context.close()


def test_the_map_shows_both_gateways_and_their_traffic_and_the_list_a_request_rate(
    fleet: Fleet, browser: Browser
) -> None:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    page = watched.page
    model = "triage-llm"
    rate = page.locator(f"tr:has(a[href='/deployments/{model}']) td.rate")
    page.goto(fleet.url + "/deployments")  # the first scrape of the routers: no rate yet
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def through_use1() -> bool:
        answer = httpx.post(f"{fleet.gateways['use1']}/v1/chat/completions", json=body, timeout=30)
        return answer.status_code == 200

    wait_until(through_use1, 90, "gateway use1 to serve a request")
    for _ in range(4):
        assert through_use1()
    httpx.post(f"{fleet.gateways['euc1']}/v1/chat/completions", json=body, timeout=30)

    def a_rate() -> bool:
        page.goto(fleet.url + "/deployments")
        shown = rate.text_content() or "—"
        return shown != "—" and float(shown) > 0

    wait_until(a_rate, 30, "the deployments list to show a request rate")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "deployments-rate.png"), full_page=True)
    page.goto(fleet.url + "/map")
    for name in ("use1", "euc1"):
        expect(page.locator(f"g.gateway.ok[data-gateway={name}]")).to_have_count(1)
    expect(page.locator("path.flow[data-gateway=use1]").first).to_be_attached()
    assert int(page.locator("path.flow").count()) >= 1
    page.screenshot(path=str(SHOTS / "map-traffic.png"), full_page=True)
    context.close()
    assert not watched.errors, watched.errors


def test_what_if_previews_and_tokens_are_created_once_disabled_and_deleted(
    fleet: Fleet, browser: Browser
) -> None:
    context = browser.new_context()
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    page = watched.page
    page.goto(fleet.url + "/placement")
    page.select_option("#wi-kind", "cluster")
    page.fill("#wi-name", "use1-a")
    page.click("button:has-text('Preview')")
    expect(page.locator("#preview-result")).to_contain_text("Plan would cost")
    expect(page.locator("#preview-result")).to_contain_text("triage-llm")  # it moves or waits

    page.goto(fleet.url + "/tokens")
    page.fill("#t-name", "dash-made")
    page.select_option("#t-role", "operator")
    page.click("button:has-text('Create')")
    secret = page.text_content("#token-created code.secret") or ""
    assert secret.startswith("gpf_")
    assert fleet.api.get(
        "/api/v1/deployments", headers={"Authorization": f"Bearer {secret}"}
    ).is_success
    page.goto(fleet.url + "/tokens")
    assert secret not in page.content()  # shown once
    page.click("#token-dash-made button:has-text('Disable')")
    expect(page.locator("#token-dash-made")).to_contain_text("disabled")
    wait_until(
        lambda: fleet.api.get(
            "/api/v1/deployments", headers={"Authorization": f"Bearer {secret}"}
        ).status_code == 401,
        10,
        "the disabled token to be refused",
    )  # fmt: skip
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#token-dash-made button:has-text('Delete')")
    expect(page.locator("#token-dash-made")).to_have_count(0)
    assert fleet.api.get("/api/v1/tokens/dash-made").status_code == 404
    context.close()


def test_a_deployments_shadow_and_the_gpus_it_holds_are_on_its_page(
    fleet: Fleet, browser: Browser
) -> None:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    watched = Watched(context, fleet.url)
    watched.login(fleet.token)
    page = watched.page
    page.goto(fleet.url + "/deployments/eu-assistant")
    expect(page.locator("p#shadow")).to_contain_text("No shadow")
    shadow = {"share": 0.05, "replicas": 1, "engine_args": ["--max-model-len", "256"]}
    set_ = fleet.api.patch("/api/v1/deployments/eu-assistant", json={"shadow": shadow})
    assert set_.status_code == 200, set_.text
    try:
        page.goto(fleet.url + "/deployments/eu-assistant")
        table = page.locator("table#shadow")
        expect(table).to_contain_text("Copies dropped")
        expect(page.get_by_text("eu-assistant--shadow")).to_be_visible()

        def held() -> bool:  # the next re-plan holds the shadow's GPUs (the pool has room)
            page.goto(fleet.url + "/deployments/eu-assistant")
            reserved = page.locator("#reserved")
            return reserved.count() > 0 and "for shadow" in (reserved.text_content() or "")

        wait_until(held, 60, "the placement to hold the shadow's GPUs")
        page.screenshot(path=str(SHOTS / "deployment-shadow.png"), full_page=True)
    finally:
        fleet.api.patch("/api/v1/deployments/eu-assistant", json={"shadow": None})
    assert not watched.errors, watched.errors
    context.close()
