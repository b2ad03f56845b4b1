"""The network a template build VM runs in: a slot of the agent's pool served by the egress service.

A Dockerfile's ``RUN apt-get install`` or ``pip install`` needs the network. The build VM gets a pooled slot like
any sandbox, under a policy of its own: ``CRYOBOX_BUILD_EGRESS`` (comma-separated CIDRs, default ``0.0.0.0/0``;
empty = no egress) allowed, beyond the host's floor (private ranges, link-local and metadata addresses, the host:
see :mod:`.denylist`), which no policy opens. Its resolver is answered by the egress service's name server. The
slot is detached and recycled when the build ends.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from ...netpolicy import EgressPolicy, parse_cidrs
from ..vm import NetAttach
from .slots import Slot

BUILD_EGRESS_ENV = "CRYOBOX_BUILD_EGRESS"
DEFAULT_BUILD_EGRESS = ("0.0.0.0/0",)


class SlotLease(Protocol):
    async def acquire(self) -> Slot: ...

    async def release(self, slot: Slot) -> None: ...


class SlotPolicies(Protocol):
    async def attach(self, sandbox_id: str, netns: str, policy: EgressPolicy) -> None: ...

    async def forget(self, sandbox_id: str) -> None: ...


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

    def __init__(self, slots: SlotLease, egress: SlotPolicies, allow: list[str] | None = None) -> None:
        self.slots = slots
        self.egress = egress
        self.policy = EgressPolicy(allow=build_egress() if allow is None else allow)
        self._ids = itertools.count()

    @contextlib.asynccontextmanager
    async def attach(self) -> AsyncIterator[NetAttach]:
        slot = await self.slots.acquire()
        owner = f"build-{slot.netns}-{next(self._ids)}"
        try:
            await self.egress.attach(owner, slot.netns, self.policy)
            yield NetAttach(slot.netns, slot.tap)
        finally:
            try:
                await self.egress.forget(owner)
            finally:
                await self.slots.release(slot)


__all__ = ["BUILD_EGRESS_ENV", "BuildNetwork", "build_egress"]
