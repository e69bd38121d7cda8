"""The live web dashboard: one HTML page and its static assets, shipped inside the package.

The dashboard is plain HTML, CSS and JavaScript so that ``pip install lorenz`` is enough to see
it — no build step, no CDN (hosts running Lorenz are often offline or firewalled). The page reads
the same ``/api/v1/events`` stream and ``/api/v1/state`` document as any other client; this
module only serves files. The server mounts :func:`dashboard_routes` next to its API routes.

Only files that exist in ``static/`` when the package is imported are served, by exact name:
there is no path to traverse. Every response carries a strict Content-Security-Policy (scripts
from this origin only, no inline script, no inline handlers), so even a tracker title that
slipped past the page's escaping could not run code.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from aiohttp import web

from lorenz.codes import ErrorCode
from lorenz.server.errors import ApiError

DASHBOARD_NOT_INSTALLED = ErrorCode.DASHBOARD_NOT_INSTALLED
DASHBOARD_ASSET_NOT_FOUND = ErrorCode.DASHBOARD_ASSET_NOT_FOUND

STATIC_DIR = Path(__file__).with_name("static")
"""Where the page and its assets live (``package-data`` ships ``server/static/*``)."""

INDEX_FILE = "index.html"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
"""What the page may load: its own scripts, styles and API, nothing inline, nothing foreign."""

_CONTENT_TYPES = MappingProxyType(
    {
        ".html": "text/html; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".js": "text/javascript; charset=utf-8",
        ".svg": "image/svg+xml; charset=utf-8",
        ".png": "image/png",
        ".ico": "image/x-icon",
    }
)

_SECURITY_HEADERS = MappingProxyType(
    {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        # NB: assets change with the installed version, not per request; "no-cache" still lets
        # the browser revalidate cheaply, and an upgraded Lorenz never serves a stale script.
        "Cache-Control": "no-cache",
    }
)


def static_files(directory: Path = STATIC_DIR) -> dict[str, Path]:
    """The servable assets by file name: regular files with a known content type."""
    if not directory.is_dir():
        return {}
    return {
        path.name: path
        for path in sorted(directory.iterdir())
        if path.is_file() and path.suffix in _CONTENT_TYPES
    }


def dashboard_routes(*, directory: Path = STATIC_DIR) -> list[web.RouteDef]:
    """Routes for ``GET /`` (the page) and ``GET /static/<name>`` (its assets)."""
    files = static_files(directory)

    async def index(request: web.Request) -> web.StreamResponse:
        page = files.get(INDEX_FILE)
        if page is None:
            raise ApiError(
                "the dashboard is not installed (lorenz/server/static/index.html is missing); "
                "reinstall the lorenz package",
                code=DASHBOARD_NOT_INSTALLED,
                status=404,
            )
        return _file_response(page)

    async def asset(request: web.Request) -> web.StreamResponse:
        path = files.get(request.match_info["name"])
        if path is None:
            raise ApiError(
                f"no dashboard asset named {request.match_info['name']!r}; "
                f"the dashboard ships {', '.join(sorted(files)) or 'none'}",
                code=DASHBOARD_ASSET_NOT_FOUND,
                status=404,
            )
        return _file_response(path)

    return [
        web.get("/", index, name="dashboard"),
        web.get("/static/{name}", asset, name="dashboard_asset"),
    ]


def _file_response(path: Path) -> web.FileResponse:
    headers = dict(_SECURITY_HEADERS)
    headers["Content-Type"] = _CONTENT_TYPES[path.suffix]
    return web.FileResponse(path, headers=headers)
