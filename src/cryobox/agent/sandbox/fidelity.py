"""Restore fidelity: a restored guest is right about its own past and wrong about the world.

Before a restored (or resumed, or woken) sandbox is reported ready, the platform makes it rejoin the world
with one ``resume`` call to the guest agent, which runs, in this order: step the wall clock to the host's
(answered on the agent's reader thread, so the error is the request's transit time), flush the neighbour
table and resolver caches, reseed the kernel RNG with fresh host entropy (``RNDADDENTROPY`` +
``RNDRESEEDCRNG``: restores of one snapshot would otherwise share the CRNG state and read identical
``/dev/urandom`` bytes), write the sandbox's instance id to ``/run/cryobox/instance-id``, and run the guest's
own resume hooks (``/etc/cryobox/resume.d/*.py``, ``cryobox_guest.on_resume``) stage by stage: clock → names →
identity → connections → readiness. Any failure, a hook's included, fails the operation with its message.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import GuestError, ResumeHookFailed
from ...util.encoding import b64
from ..guest.client import GuestClient

ENTROPY_BYTES = 64
RESUME_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class RejoinReport:
    step_ns: int
    """How far the guest clock was stepped (host minus guest before)."""
    instance_id: str
    neighbours_flushed: int = 0
    resolver: str = "none"
    steps_ms: dict[str, float] = field(default_factory=dict)
    hooks: list[dict[str, Any]] = field(default_factory=list)


async def sync_clock(guest: GuestClient) -> int:
    """Step the guest's wall clock to the host's (``set_clock``, answered on the agent's reader thread, no
    process start). Returns the step in ns (host minus the guest's clock before it)."""
    host_ns = time.time_ns()
    reply = await guest.call("set_clock", {"epoch_ns": host_ns}, timeout=10)
    return host_ns - int(reply["before_ns"])


async def rejoin(guest: GuestClient, instance_id: str, *, run_hooks: bool = True) -> RejoinReport:
    """Run the guest's ``resume`` sequence; raises :class:`GuestError` naming every step or hook that failed."""
    reply = await guest.call(
        "resume",
        {
            "epoch_ns": time.time_ns(),
            "entropy": b64(os.urandom(ENTROPY_BYTES)),
            "instance_id": instance_id,
            "run_hooks": run_hooks,
        },
        timeout=RESUME_TIMEOUT_S,
    )
    errors: dict[str, str] = dict(reply.get("errors") or {})
    if not reply.get("reseeded"):
        errors.setdefault("reseed", "the guest RNG was not reseeded")
    failed = [h for h in reply.get("hooks", []) if not h.get("ok")]
    if errors or failed:
        parts = [f"{step}: {message}" for step, message in errors.items()]
        parts += [f"hook {h.get('name')} ({h.get('order')}): {h.get('error')}" for h in failed]
        error = GuestError if errors else ResumeHookFailed  # the platform's own steps failing is our bug
        raise error(
            "the guest did not rejoin cleanly after restore: " + "; ".join(parts),
            details={"errors": errors, "failed_hooks": failed},
        )
    # The first step's error is the request's transit, which in a freshly restored QEMU under TCG includes
    # translating the agent's code (measured ~225 ms); the agent's path is warm now, so step once more.
    refine_ns = await sync_clock(guest)
    return RejoinReport(
        step_ns=int(reply["step_ns"]) + refine_ns,
        instance_id=str(reply["instance_id"]),
        neighbours_flushed=int(reply.get("neighbours_flushed", 0)),
        resolver=str(reply.get("resolver", "none")),
        steps_ms={k: float(v) for k, v in (reply.get("steps_ms") or {}).items()},
        hooks=list(reply.get("hooks", [])),
    )
