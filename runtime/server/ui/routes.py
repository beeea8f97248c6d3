"""``/ui``: the live page, and the one JSON route it polls.

The page itself (``/ui`` and ``/ui/static/*``: HTML, JS and CSS shipped in this package, nothing
fetched from elsewhere) is the same for every caller and holds no data, so it is served without a
key: with API keys on it asks for one, keeps it in the tab's ``sessionStorage`` and sends it as
``Authorization: Bearer`` to ``GET /ui/api/live``, which like every other route answers 401 without
it, and then shows only the caller's tenant's requests.  No cookie is ever set, so another site
cannot make a browser read the data on a user's behalf; the Host allow-list (guard.py) applies to
every path, and a strict Content-Security-Policy keeps the page to its own origin.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers

from kvreuse.runtime.server.errors import APIError, bad_request
from kvreuse.runtime.server.state import ServerState
from kvreuse.runtime.server.ui.live import LiveView

STATIC = {"index.html": "text/html", "ui.js": "text/javascript", "ui.css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_page(path: str) -> bool:
    """The keyless part: the page's own files (no data in them)."""
    return path in ("/ui", "/ui/") or path.startswith("/ui/static/")


def page_open(authenticate: Callable[[str, Headers], str | None]) -> Callable[[str, Headers], str | None]:
    """``authenticate`` with the page's files let through; its data route still needs the key."""

    def check(path: str, headers: Headers) -> str | None:
        return None if is_page(path) else authenticate(path, headers)

    return check


def install_ui(app: FastAPI, state: ServerState) -> None:
    """Serve the page and its data route on ``app``."""
    root = files(__package__) / "static"
    bodies = {name: (root / name).read_bytes() for name in STATIC}
    live = LiveView(state)

    def static(name: str) -> Response:
        return Response(bodies[name], media_type=f"{STATIC[name]}; charset=utf-8", headers=HEADERS)

    @app.get("/ui", include_in_schema=False)
    @app.get("/ui/", include_in_schema=False)
    async def page() -> Response:
        return static("index.html")

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in bodies:
            raise APIError(404, f"no such file: {name[:64]!r}", type="not_found_error", code="not_found")
        return static(name)

    @app.get("/ui/api/live", include_in_schema=False)
    async def live_data(request: Request, after: str = "0") -> Response:
        if not after.isdigit() or len(after) > 18:
            raise bad_request("after must be a non-negative integer (the last seq the page has)", "after")
        body = await live.snapshot(request.state.tenant, int(after))
        return JSONResponse(body, headers={"Cache-Control": "no-store"})
