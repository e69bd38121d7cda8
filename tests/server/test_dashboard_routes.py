"""The dashboard's HTTP side: the page and its assets, served from the package, locked down."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest

from lorenz.server.dashboard import (
    CONTENT_SECURITY_POLICY,
    STATIC_DIR,
    dashboard_routes,
    static_files,
)
from tests.server.helpers import issue, make_rig, serve


@pytest.fixture
async def dashboard_url(tmp_path: Path) -> str:
    rig = make_rig(tmp_path, issues=[issue(1)])
    served = await serve(rig, static_routes=dashboard_routes())
    return served.url


async def test_index_is_html_with_a_strict_policy(
    dashboard_url: str, http: aiohttp.ClientSession
) -> None:
    async with http.get(dashboard_url + "/") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
        assert response.charset == "utf-8"
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        page = await response.text()
    assert 'data-testid="lane-running"' in page
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("dashboard.js", "text/javascript"),
        ("dashboard.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
async def test_assets_are_served_with_their_types(
    dashboard_url: str, http: aiohttp.ClientSession, name: str, content_type: str
) -> None:
    async with http.get(f"{dashboard_url}/static/{name}") as response:
        assert response.status == 200
        assert response.content_type == content_type
        assert await response.read() == (STATIC_DIR / name).read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/static/missing.js",
        "/static/..%2Fdashboard.py",
        "/static/%2E%2E%2F__init__.py",
        "/static/../dashboard.py",
        "/static/",
    ],
)
async def test_nothing_outside_the_asset_list_is_served(
    dashboard_url: str, http: aiohttp.ClientSession, path: str
) -> None:
    async with http.get(dashboard_url + path) as response:
        assert response.status == 404
        body = await response.json()
    assert body["error"]["code"] in ("dashboard_asset_not_found", "route_not_found")
    assert "import" not in json.dumps(body)  # no Python source came back


async def test_an_unknown_asset_names_what_exists(
    dashboard_url: str, http: aiohttp.ClientSession
) -> None:
    async with http.get(dashboard_url + "/static/app.js") as response:
        assert response.status == 404
        error = (await response.json())["error"]
    assert error["code"] == "dashboard_asset_not_found"
    assert "dashboard.js" in error["message"]


def test_every_asset_the_page_references_is_shipped() -> None:
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    referenced = set(re.findall(r'(?:src|href)="/static/([^"]+)"', page))
    assert referenced == {"dashboard.js", "dashboard.css", "favicon.svg"}
    assert referenced <= set(static_files())


def test_no_asset_loads_anything_from_another_origin() -> None:
    # NB: hosts running Lorenz are often offline; a CDN link would leave a blank page.
    for name, path in static_files().items():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", text), name
        assert "@import" not in text, name


def test_page_script_never_writes_html_from_data() -> None:
    script = (STATIC_DIR / "dashboard.js").read_text(encoding="utf-8")
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("//"))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in code, sink


def test_a_missing_page_is_a_clear_404(tmp_path: Path) -> None:
    assert static_files(tmp_path / "nowhere") == {}
    routes = dashboard_routes(directory=tmp_path)
    assert {route.path for route in routes} == {"/", "/static/{name}"}


async def test_missing_index_answers_with_what_is_wrong(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    empty = tmp_path / "static"
    empty.mkdir()
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig, static_routes=dashboard_routes(directory=empty))
    async with http.get(served.url + "/") as response:
        assert response.status == 404
        error = (await response.json())["error"]
    assert error["code"] == "dashboard_not_installed"
    assert "reinstall" in error["message"]
