"""A control plane that just started routes to an ``up`` agent whose last heartbeat is older than the deadline:
the silence was its own absence (it restarted), not the agent's. After its first deadline the heartbeat decides."""

from __future__ import annotations

import pytest

from cryobox.errors import HostUnavailable
from cryobox.registry import Registry
from cryobox.server.control.fleet import Fleet, FleetConfig
from tests.support.registry import db_url, pg_server, registry

__all__ = ["db_url", "pg_server", "registry"]  # fixtures
DEADLINE_S = 10.0


async def test_a_restarted_control_plane_trusts_an_up_row_for_its_first_deadline(registry: Registry) -> None:
    now = [1000.0]
    registry.fleet.heartbeat("a1", url="http://127.0.0.1:9", boot_id="b", capacity={}, info={}, now=now[0])
    now[0] += 30.0  # the control plane was down 30 s: no heartbeat could reach it
    fleet = Fleet(registry, FleetConfig(deadline_s=DEADLINE_S, node_token="t"), clock=lambda: now[0])
    assert await fleet.agent("a1") is not None  # routed: the agent itself decides (a dead one fails at the transport)
    now[0] += DEADLINE_S  # its first deadline is over and a1 never beat: silent for real
    fleet.forget_row("a1")
    with pytest.raises(HostUnavailable, match="not answering heartbeats"):
        await fleet.agent("a1")
    registry.fleet.heartbeat("a1", url="http://127.0.0.1:9", boot_id="b", capacity={}, info={}, now=now[0])
    fleet.forget_row("a1")
    assert await fleet.agent("a1") is not None
    await fleet.close()
