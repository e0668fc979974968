"""Third-party browser assets: installed by `make install` (npm ci from assets/package-lock.json
into the git-ignored assets/node_modules), served from there under /vendor. Only the files
named here are served; nothing of Node runs at run time."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from controlplane.errors import NotFound

HERE = Path(__file__).parent
MODULES = HERE / "assets" / "node_modules"
STATIC = HERE / "static"

VENDOR: dict[str, str] = {
    "htmx.min.js": "htmx.org/dist/htmx.min.js",
    "htmx-ext-sse.js": "htmx-ext-sse/dist/sse.min.js",
    "swagger-ui-bundle.js": "swagger-ui-dist/swagger-ui-bundle.js",
    "swagger-ui.css": "swagger-ui-dist/swagger-ui.css",
    "favicon-32x32.png": "swagger-ui-dist/favicon-32x32.png",
}
WORLD = MODULES / "world-atlas" / "land-110m.json"
MISSING = "run `make install` (it fetches the dashboard's assets with npm ci)"


def vendor_path(name: str) -> Path:
    rel = VENDOR.get(name)
    path = MODULES / rel if rel else None
    if path is None or not path.is_file():
        raise NotFound(f"no asset '{name}'" + ("" if rel is None else f"; {MISSING}"))
    return path


def assets_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/vendor/{name}")
    def vendor(name: str) -> FileResponse:
        return FileResponse(vendor_path(name), headers={"Cache-Control": "public, max-age=86400"})

    return router


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC)
