"""Restore fidelity: a restored guest is right about its own past and wrong about the world.

Before a restored (or resumed, or woken) sandbox is reported ready, the platform makes it rejoin the world
with one ``resume`` call to the guest agent, which runs, in this order: step the wall clock to the host's
(answered on the agent's reader thread, so the error is the request's transit time), flush the neighbour
table and resolver caches, reseed the kernel RNG with fresh host entropy (``RNDADDENTROPY`` +
``RNDRESEEDCRNG``: restores of one snapshot would otherwise share the CRNG state and read identical
``/dev/urandom`` bytes), write the sandbox's instance id to ``/run/cryobox/instance-id``, and run the guest's
own resume hooks (``/etc/cryobox/resume.d/*.py``, ``cryobox_guest.on_resume``) stage by stage: clock → names →
identity → connections → readiness. Any failure, a hook's included, fails the operation with its message.

A restore that brought volumes (:mod:`..vm.volumes`) has the guest mount them in the same call, right after the
clock step and before any hook (no exec: a process start costs tens of ms under TCG); a volume that does not
mount fails the operation with a :class:`~cryobox.errors.StateError` naming it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import GuestError, ResumeHookFailed, StateError
from ...util.encoding import b64
from ..guest.client import GuestClient
from ..vm.volumes import AttachedVolume

ENTROPY_BYTES = 64
RESUME_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class RejoinReport:
    step_ns: int
    """How far the resume stepped the guest clock (host minus guest before; the refinement sent after it is a
    transit's worth and not counted)."""
    instance_id: str
    neighbours_flushed: int = 0
    resolver: str = "none"
    steps_ms: dict[str, float] = field(default_factory=dict)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """The guest's report of each volume it mounted (``path``, ``device``, ``ms``)."""


def check_mounts(wanted: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The guest's volume results, one per mount asked for. :raises StateError: one failed (naming it)."""
    results = reply.get("volumes")
    if not isinstance(results, list) or len(results) != len(wanted):
        raise GuestError("the guest did not report the volumes it was asked to mount")
    failed = [r for r in results if not isinstance(r, dict) or not r.get("ok")]
    if failed:
        parts = [f"{r.get('path')}: {r.get('error')}" if isinstance(r, dict) else repr(r) for r in failed]
        raise StateError(
            "the guest could not mount its volumes: " + "; ".join(parts),
            state="unmountable",
            details={"volumes": failed},
        )
    return results


async def rejoin(
    guest: GuestClient,
    instance_id: str,
    *,
    run_hooks: bool = True,
    volumes: Sequence[AttachedVolume] = (),
    rejoined: bool = False,
) -> RejoinReport:
    """Run the guest's ``resume`` sequence, mounting ``volumes`` (those with a mount path) first; raises
    :class:`GuestError` naming every step or hook that failed, :class:`StateError` for a volume. ``rejoined``: the
    guest ran it as ``instance_id`` while it warmed in the pool (``MicroVM.rejoined_as``), so its names and
    identity are kept if it says that instance still (:mod:`cryobox.guest.ops_resume`)."""
    args: dict[str, Any] = {
        "epoch_ns": time.time_ns(),
        "entropy": b64(os.urandom(ENTROPY_BYTES)),
        "instance_id": instance_id,
        "run_hooks": run_hooks,
    }
    if rejoined:
        args["rejoined"] = True
    mounts = [m for m in (v.guest_mount() for v in volumes) if m is not None]
    if mounts:
        args["volumes"] = mounts
    reply = await guest.call("resume", args, timeout=RESUME_TIMEOUT_S)
    mounted = check_mounts(mounts, reply) if mounts else []
    errors: dict[str, str] = dict(reply.get("errors") or {})
    if not reply.get("reseeded") and not (rejoined and reply.get("rejoined") is True):
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
    # translating the agent's code (measured ~225 ms); the agent's path is warm now, so step once more. Not
    # waited for: set_clock is answered on the guest's reader thread in the order sent, so any later call
    # (the sandbox's first exec, a file write) is read after it took effect; its round trip (~1.6 ms under
    # TCG) was the last step of every create, resume and wake.
    await guest.post("set_clock", {"epoch_ns": time.time_ns()}, timeout=10)
    return RejoinReport(
        step_ns=int(reply["step_ns"]),
        instance_id=str(reply["instance_id"]),
        neighbours_flushed=int(reply.get("neighbours_flushed", 0)),
        resolver=str(reply.get("resolver", "none")),
        steps_ms={k: float(v) for k, v in (reply.get("steps_ms") or {}).items()},
        hooks=list(reply.get("hooks", [])),
        volumes=mounted,
    )
