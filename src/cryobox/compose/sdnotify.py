"""systemd's readiness protocol (``sd_notify``): datagrams of ``KEY=value`` lines to ``$NOTIFY_SOCKET``.

``cryobox serve``, ``cryobox agent`` and ``cryobox control`` under ``Type=notify`` say ``READY=1`` once they
serve (not when the process starts, which is ~3 s and, on a first run, the template bakes before) and
``STOPPING=1`` when they stop. At an upgrade (:mod:`.handover`) the old main ``serve`` names its successor with
``MAINPID=`` before it stops, so systemd keeps tracking the service (``KillMode=process``: the VMs stay) instead of
taking the old process's exit for the service's. The variable is kept in the environment: a successor inherits it,
and its ``READY=1`` is the new main pid's. Nothing is sent when the variable is unset (not under systemd).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn

NOTIFY_ENV = "NOTIFY_SOCKET"


def notify(*lines: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``lines`` (``READY=1``, ``MAINPID=123`` ...) to the service manager; False when there is none to tell or
    the datagram could not be sent (a readiness note never stops the server)."""
    address = (os.environ if env is None else env).get(NOTIFY_ENV, "")
    if not address or not lines:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # vsock and other transports: not used by a service on this host
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto("\n".join(lines).encode(), address)
        except OSError:
            return False
    return True


async def notify_when_serving(server: uvicorn.Server) -> None:
    """``READY=1`` once ``server`` serves: its lifespan has run and it accepts (nothing if it stops first)."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.02)
    notify("READY=1", "STATUS=serving")


@contextlib.asynccontextmanager
async def readiness(server: uvicorn.Server, stopping: Callable[[], bool] = lambda: True) -> AsyncIterator[None]:
    """For the block that serves ``server``: ``READY=1`` once it serves, ``STOPPING=1`` when the block ends (unless
    ``stopping()`` says no: after an upgrade's hand-over the successor is the main process)."""
    ready = asyncio.create_task(notify_when_serving(server), name="sd_notify READY")
    try:
        yield
    finally:
        ready.cancel()
        if stopping():
            notify("STOPPING=1")
