"""What a host's start has brought up so far, torn down in reverse if a later step fails
(:func:`.startup.start_host`)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from ..disk.volume import Volume, release_volume
from ..memory.client import MemoryServerProcess
from ..net.egress.service import EgressService
from ..net.firewall import Firewall
from ..net.pool import SlotPool
from .ownership import Ownership


@dataclass
class Started:
    """What start_host has brought up so far (torn down in reverse if a later step fails)."""

    slots: SlotPool | None = None
    firewall: Firewall | None = None
    firewalling: asyncio.Future[None] | None = None
    """The host table's load, running beside the later steps (waited for before it is removed)."""
    egress: EgressService | None = None
    memserver: MemoryServerProcess | None = None
    volume: Volume | None = None
    ownership: Ownership | None = None
    adopted: bool = False
    """VMs of the previous agent run on: leave their slots, memory server and volume for the next try."""

    async def undo(self, data_dir: Path) -> None:
        try:
            await self._undo(data_dir)
        finally:
            if self.ownership is not None:
                self.ownership.release()

    async def _undo(self, data_dir: Path) -> None:
        if self.firewalling is not None:
            with contextlib.suppress(Exception):  # its own failure is what is being undone, or it is done
                await self.firewalling
        if self.egress is not None:
            await self.egress.close()
        if self.adopted:
            if self.slots is not None:
                await self.slots.detach()
            if self.memserver is not None:
                await self.memserver.aclose(keep=True)
            return
        if self.memserver is not None:
            await self.memserver.aclose()
        if self.slots is not None:
            await self.slots.close()
        if self.firewall is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.firewall.remove)
        if self.volume is not None and self.volume.image is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(release_volume, data_dir)
