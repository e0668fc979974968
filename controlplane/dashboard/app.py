"""Mounts the dashboard on the API app: pages at `/`, its assets, the login redirect."""

from __future__ import annotations

import time

from fastapi import FastAPI

from controlplane.dashboard.actions import FEED_EVERY_S, actions_router
from controlplane.dashboard.assets import assets_router, static_files
from controlplane.dashboard.pages import pages_router
from controlplane.dashboard.rates import RequestRates
from controlplane.dashboard.web import LoginRequired, to_login
from controlplane.services.sessions import SessionStore


def install(app: FastAPI, feed_every_s: float = FEED_EVERY_S) -> None:
    app.state.feed_every_s = feed_every_s
    app.state.dashboard_sessions = SessionStore(app.state.session_factory)
    app.state.request_rates = RequestRates(time.monotonic)  # per process: the routers' last scrapes
    app.add_exception_handler(LoginRequired, to_login)
    app.include_router(assets_router())
    app.include_router(actions_router())
    app.include_router(pages_router())
    app.mount("/static", static_files(), name="static")
