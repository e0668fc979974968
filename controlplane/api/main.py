"""Process entry for the API server: `uvicorn --factory controlplane.api.main:build_app`."""

from __future__ import annotations

import logging

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.settings import get_settings


def build_app() -> FastAPI:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    return create_app(get_settings())
