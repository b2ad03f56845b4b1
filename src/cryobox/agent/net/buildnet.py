"""The network a template build VM runs in: a slot of the agent's pool with egress and a DNS relay.

A Dockerfile's ``RUN apt-get install`` or ``pip install`` needs the network. The build VM gets a pooled slot like
any sandbox: the host firewall's floor (private ranges, link-local and metadata addresses, the host: see
:mod:`.denylist`) applies before any grant, so a build can never reach them; within it the slot is granted
``CRYOBOX_BUILD_EGRESS`` (comma-separated CIDRs, default ``0.0.0.0/0``; empty = no egress), and
:mod:`.dnsrelay` answers its resolver. The grant is cleared and the slot recycled when the build ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from ...netpolicy import parse_cidrs
from ..vm import NetAttach
from .dnsrelay import dns_relay
from .slots import Slot

BUILD_EGRESS_ENV = "CRYOBOX_BUILD_EGRESS"
DEFAULT_BUILD_EGRESS = ("0.0.0.0/0",)


class SlotLease(Protocol):
    async def acquire(self) -> Slot: ...

    async def release(self, slot: Slot) -> None: ...


class EgressGrant(Protocol):
    def allow_egress(self, slot: Slot, cidrs: list[str]) -> None: ...


def build_egress(env: Mapping[str, str] | None = None) -> list[str]:
    """What build VMs may reach beyond the floor (``CRYOBOX_BUILD_EGRESS``); ``InvalidArgument`` if malformed."""
    raw = (os.environ if env is None else env).get(BUILD_EGRESS_ENV)
    if raw is None:
        return list(DEFAULT_BUILD_EGRESS)
    cidrs = [c.strip() for c in raw.split(",") if c.strip()]
    parse_cidrs(cidrs)
    return cidrs


class BuildNetwork:
    """Lends build VMs a slot with egress and DNS (one per build, returned when it ends)."""

    def __init__(self, slots: SlotLease, firewall: EgressGrant, egress: list[str] | None = None) -> None:
        self.slots = slots
        self.firewall = firewall
        self.egress = build_egress() if egress is None else egress

    @contextlib.asynccontextmanager
    async def attach(self) -> AsyncIterator[NetAttach]:
        slot = await self.slots.acquire()
        try:
            if self.egress:
                await asyncio.to_thread(self.firewall.allow_egress, slot, self.egress)
            async with dns_relay(slot.netns):
                yield NetAttach(slot.netns, slot.tap)
        finally:
            await self.slots.release(slot)  # clears the grant before the slot is reused


__all__ = ["BUILD_EGRESS_ENV", "BuildNetwork", "build_egress"]
