"""The console's single-page app at ``/ui``: ``index.html`` for ``/ui`` and ``/ui/``, the files under
``static/`` below it, every ``/ui`` response with a strict Content-Security-Policy (no inline script or style,
nothing from another origin, no framing) and ``X-Content-Type-Options: nosniff``."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import NotFound
from ..server.access.cookies import UI_PREFIX

STATIC_DIR = Path(__file__).parent / "static"
CSP = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class ConsoleHeadersMiddleware:
    """Adds :data:`SECURITY_HEADERS` to every response under ``/ui`` (pure ASGI: streams pass unbuffered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not (path == UI_PREFIX or path.startswith(UI_PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def index_router(static_dir: Path) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    async def index() -> FileResponse:
        page = static_dir / "index.html"
        if not page.is_file():
            raise NotFound("the console is not built into this package (console/static/index.html is missing)")
        return FileResponse(page, media_type="text/html", headers={"Cache-Control": "no-cache"})

    router.add_api_route(UI_PREFIX, index, methods=["GET"])
    router.add_api_route(UI_PREFIX + "/", index, methods=["GET"])
    return router


def mount_console(app: FastAPI, static_dir: Path = STATIC_DIR) -> None:
    """``/ui`` and its files (after the console's API routes, which take precedence)."""
    app.include_router(index_router(static_dir))
    app.mount(UI_PREFIX, StaticFiles(directory=static_dir, check_dir=False), name="console")
    app.add_middleware(ConsoleHeadersMiddleware)
