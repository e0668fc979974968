"""`/api/v1/docs`: Swagger UI from the dashboard's local assets (no CDN), with the Authorize
button of the document's bearer scheme."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse


def docs_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/api/v1/docs")
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/api/v1/openapi.json",
            title="gpufleet admin API",
            swagger_js_url="/vendor/swagger-ui-bundle.js",
            swagger_css_url="/vendor/swagger-ui.css",
            swagger_favicon_url="/vendor/favicon-32x32.png",
            # not persisted: swagger-ui keeps an authorised token in localStorage, in clear,
            # past the dashboard's logout (its HttpOnly cookie exists to avoid exactly that)
            swagger_ui_parameters={"persistAuthorization": False},
        )

    return router
