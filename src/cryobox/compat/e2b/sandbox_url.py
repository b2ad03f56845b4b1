"""The E2B sandbox URL in the control-plane app: envd (``envd/``) mounted at ``/e2b/sandbox``, and every other
guest port reached through the same reverse proxy as ``/v1/sandboxes/{id}/ports/{port}`` (``cryobox.proxy``,
the sandbox's agent choosing where the traffic goes: its guest address, or its own port route in a fleet). envd's
file route is at the root too (``/files``: where the SDK's signed file URLs point, see ``envd/app.py``)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ...agentapi.interface import Agent
from ...errors import CryoboxError
from ...proxy import PortProxy, reply_error
from .access import SandboxAccess
from .envd import EnvdApp, create_envd_app
from .envd.app import FILES_ROUTE

PREFIX = "/e2b/sandbox"


class PortForward:
    """The envd app's :class:`~.envd.Forward`: a request for a port other than envd's goes to the guest."""

    def __init__(self, proxy: PortProxy) -> None:
        self._proxy = proxy

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        agent: Agent,
        sandbox_id: str,
        port: int,
        *,
        host: str | None = None,
    ) -> None:
        try:
            target = await agent.port_target(sandbox_id, port)
        except CryoboxError as error:
            await reply_error(scope, send, error)
            return
        path = str(scope.get("path") or "/")
        await self._proxy.forward(scope, receive, send, target, path, port=port, host=host)


class RootFiles:
    """``/files`` at the root, as an ASGI app (a Starlette ``Route`` takes a bound method for a request handler)."""

    def __init__(self, envd: EnvdApp) -> None:
        self._envd = envd

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._envd.files_at_root(scope, receive, send)


def mount_sandbox_url(app: FastAPI, access: SandboxAccess, proxy: PortProxy) -> EnvdApp:
    """Mount the sandbox URL on ``app`` (and envd's ``/files`` at the root); the caller closes the returned app at
    shutdown."""
    envd = create_envd_app(access, PortForward(proxy), prefix=PREFIX)
    app.mount(PREFIX, envd)
    app.router.routes.append(Route(FILES_ROUTE, RootFiles(envd), include_in_schema=False))
    return envd
