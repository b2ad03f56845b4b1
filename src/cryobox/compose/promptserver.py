"""uvicorn's server without its tenth-of-a-second ticks on the way out.

uvicorn notices a stop at its next 0.1 s tick, then sleeps 0.1 s after asking its connections to close and polls
them every 0.1 s: ~0.25 s of every stop in which nothing happens, and a restart's or an upgrade's window waits for
all of it (the new process can take the data dir only once this one has let it go). This server wakes when told to
stop (a signal, or ``should_exit`` set by the code: an upgrade, a standby's takeover) and polls its connections
every 5 ms; the graceful timeout, the order of the steps and what each one does are uvicorn's (0.55, pinned).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from ..util.steps import StepTimes

log = logging.getLogger("uvicorn.error")

POLL_S = 0.005
TICK_S = 0.1
"""uvicorn's own tick, still used for its once-a-second work (the ``Date`` header)."""


class PromptServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_requested = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._should_exit = False
        self.stop_times = StepTimes("stop")
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self.stop_times.begin()
        if value and self._loop is not None:  # from a signal handler too: call_soon_threadsafe is the safe way in
            self._loop.call_soon_threadsafe(self._exit_requested.set)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), TICK_S)
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._wait_tasks_to_complete()
        except TimeoutError:
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        self.stop_times.mark("drained")
        if not self.force_exit:
            await self.lifespan.shutdown()
            self.stop_times.mark("app closed")

    async def _wait_tasks_to_complete(self) -> None:
        if self.server_state.connections and not self.force_exit:
            log.info("Waiting for connections to close. (CTRL+C to force quit)")
            while self.server_state.connections and not self.force_exit:
                await asyncio.sleep(POLL_S)
        if self.server_state.tasks and not self.force_exit:
            log.info("Waiting for background tasks to complete. (CTRL+C to force quit)")
            while self.server_state.tasks and not self.force_exit:
                await asyncio.sleep(POLL_S)
        for server in self.servers:
            await server.wait_closed()
