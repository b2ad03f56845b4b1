"""The agent's side of registration and heartbeats: what it reports, and the loop that sends it.

An agent sends :class:`~.models.Heartbeat` (who it is, its capacity, every sandbox it runs) to the control
plane's ``POST /internal/v1/heartbeat`` every ``interval_s``, authenticated by the node token. The first one
after a start carries a new ``boot_id``: the control plane then reconciles the rows of this host against the
report. A control plane that is away is retried at the same pace; the agent keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from .interface import Agent
from .models import Heartbeat, HeartbeatReply

log = logging.getLogger(__name__)


async def heartbeat_of(agent: Agent) -> Heartbeat:
    """What ``agent`` reports now."""
    info, capacity, sandboxes = await asyncio.gather(agent.info(), agent.capacity(), agent.list_sandboxes())
    return Heartbeat(agent=info, capacity=capacity, sandboxes=sandboxes)


class HeartbeatSender:
    def __init__(
        self,
        agent: Agent,
        control_url: str,
        token: str,
        *,
        interval_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.agent = agent
        self.interval_s = interval_s
        self._http = httpx.AsyncClient(
            base_url=control_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=max(5.0, interval_s * 2),
            transport=transport,
        )
        self.sent = 0
        self.failures = 0

    async def beat(self) -> HeartbeatReply:
        hb = await heartbeat_of(self.agent)
        response = await self._http.post("/internal/v1/heartbeat", content=hb.model_dump_json())
        response.raise_for_status()
        self.sent += 1
        return HeartbeatReply.model_validate_json(response.content)

    async def run(self) -> None:
        """Beat forever (cancel to stop); failures are logged, counted and retried."""
        while True:
            try:
                reply = await self.beat()
                if reply.reconciled:
                    log.info("registered with the control plane (rows of this host reconciled)")
            except (httpx.HTTPError, OSError) as err:
                self.failures += 1
                if self.failures == 1 or self.failures % 30 == 0:
                    log.warning("heartbeat to the control plane failed (%d so far): %s", self.failures, err)
            await asyncio.sleep(self.interval_s)

    async def aclose(self) -> None:
        await self._http.aclose()
