"""A sandbox: one restored MicroVM plus what the platform knows about it."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field

from ...errors import StateError
from ...netpolicy import EgressPolicy
from ..net.slots import Slot
from ..snapshot.store import SnapshotImage
from ..vm import MicroVM
from ..vm.volumes import AttachedVolume


class SandboxState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    HIBERNATED = "hibernated"
    STOPPED = "stopped"
    ERROR = "error"

    @property
    def accepts_requests(self) -> bool:
        return self is SandboxState.RUNNING

    @property
    def live(self) -> bool:
        """Its QEMU runs (its vCPUs may be stopped): what a durable record names and a hibernation captures."""
        return self in (SandboxState.RUNNING, SandboxState.PAUSED)


@dataclass
class Sandbox:
    id: str
    template: str
    cpus: int
    memory_mib: int
    vm: MicroVM
    created_at: float
    boot_mode: str = "restore"
    boot_ms: float = 0.0
    state: SandboxState = SandboxState.STARTING
    workspace_id: str = "default"
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    persistent: bool = False
    ttl_s: int | None = None
    last_active: float = field(default_factory=time.time)
    from_snapshot: str | None = None
    instance_id: str = ""
    """New for every sandbox (every restore); written to ``/run/cryobox/instance-id`` in the guest."""
    egress: EgressPolicy | None = None
    """The network policy its egress proxy and name server enforce; ``None``: nothing allowed."""
    slot: Slot | None = None
    """The network slot the sandbox's QEMU runs in; the host reaches the guest at ``slot.address``."""
    hibernation: SnapshotImage | None = None
    """The capture a hibernated sandbox wakes from (its QEMU is gone meanwhile)."""
    mapped_image: str | None = None
    """The hot copy (key) of the hibernation image this sandbox's VM woke from and still maps; dropped when
    that VM goes."""
    adopted: bool = False
    """Taken over from an earlier agent process at start (its QEMU outlived that agent)."""
    volumes: tuple[AttachedVolume, ...] = ()
    """The volumes attached to it (:mod:`..vm.volumes`): re-attached when it wakes, settled before it is killed."""
    in_flight: int = 0
    """Requests running in the sandbox now (exec, streams, terminals): a busy sandbox never expires."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def expires_at(self) -> float | None:
        """TTL is idle-based: a sandbox expires ``ttl_s`` after its last request; persistent ones never do, and a
        hibernated one's TTL does not run (it holds no memory or CPU; the control plane's paused retention bounds
        it; a wake restarts the idle clock)."""
        if self.ttl_s is None or self.persistent or self.state is SandboxState.HIBERNATED:
            return None
        return self.last_active + self.ttl_s

    @property
    def guest_ip(self) -> str | None:
        return self.slot.address if self.slot is not None else None

    def idle_s(self, now: float) -> float:
        return 0.0 if self.in_flight else max(0.0, now - self.last_active)

    def expired(self, now: float) -> bool:
        """Idle past its TTL with nothing in flight (a long exec or an open terminal keeps it alive)."""
        expires = self.expires_at
        return expires is not None and self.in_flight == 0 and expires <= now

    def require_running(self) -> None:
        if not self.state.accepts_requests:
            raise StateError(f"sandbox {self.id} is {self.state.value}", state=self.state.value, required="running")

    def touch(self, now: float | None = None) -> None:
        self.last_active = time.time() if now is None else now
