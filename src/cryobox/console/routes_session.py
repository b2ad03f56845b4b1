"""``POST /ui/login``, ``GET /ui/session``, ``POST /ui/logout``: the console's cookie session over an API key."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidArgument, Unauthorized
from ..server.access import cookies as auth
from ..server.access.sessions import COOKIE_NAME, CSRF_HEADER, csrf_for
from ..server.routes.deps import PublicCtx
from ..server.routes.errors import ERROR_RESPONSES

router = APIRouter(prefix="/ui", tags=["console"], responses=ERROR_RESPONSES, include_in_schema=False)
"""Console-internal (not in the OpenAPI document: a fuzzer must not log in with made-up keys)."""


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: str = Field(min_length=1, max_length=512)


class SessionView(BaseModel):
    workspace: str
    csrf_token: str


def _client(request: Request) -> str:
    return request.client.host if request.client else "-"


@router.post("/login", response_model=SessionView)
async def login(body: LoginRequest, request: Request, response: Response, ctx: PublicCtx) -> SessionView:
    """Exchange an API key (in the JSON body, never a URL) for a session cookie (HttpOnly, SameSite=Strict) and
    the session's CSRF token."""
    if request.url.query:
        raise InvalidArgument("POST /ui/login takes no query string: the API key goes in the JSON body only")
    made = await asyncio.to_thread(ctx.sessions.login, body.api_key.strip())
    if made is None:
        ctx.failures.failed(_client(request))
        raise Unauthorized("invalid or revoked API key")
    response.set_cookie(
        COOKIE_NAME,
        made.token,
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )
    response.headers["Cache-Control"] = "no-store"
    return SessionView(workspace=made.session.workspace.name, csrf_token=made.csrf_token)


@router.get("/session", response_model=SessionView)
async def session(request: Request, response: Response, ctx: PublicCtx) -> SessionView:
    """The current session's workspace and CSRF token (401 without a live session cookie)."""
    token = auth.session_token(request.headers.get("cookie"))
    if token is None:
        raise Unauthorized("no console session (POST /ui/login first)")
    info = await asyncio.to_thread(auth.check_session, ctx.sessions, token, "GET", None)
    response.headers["Cache-Control"] = "no-store"
    return SessionView(workspace=info.workspace.name, csrf_token=csrf_for(token))


@router.post("/logout", status_code=204, response_class=Response)
async def logout(request: Request, ctx: PublicCtx) -> Response:
    """End the session server-side (on every replica) and clear the cookie. A live session needs its
    ``X-CSRF-Token``; without a live session this only clears the cookie."""
    token = auth.session_token(request.headers.get("cookie"))
    if token is not None and await asyncio.to_thread(ctx.sessions.authenticate, token) is not None:
        await asyncio.to_thread(auth.check_session, ctx.sessions, token, "POST", request.headers.get(CSRF_HEADER))
        await asyncio.to_thread(ctx.sessions.logout, token)
    response = Response(status_code=204)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response
