"""The agent's own lines in a sandbox's log: what happened to it on this host (started, adopted, paused, resumed,
hibernated, woken, its network policy or timeout changed), told from the changes the sandbox service records.

The service calls :meth:`Journal.changed` after each durable write of a sandbox (every state change is written
before it is reported); the journal compares what it saw last and writes a line per difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...agentapi.models_obs import LogLevel
from ...netpolicy import EgressPolicy
from ..sandbox.sandbox import Sandbox, SandboxState
from .logbook import LogBook

MAX_RULES_SHOWN = 8


@dataclass(frozen=True)
class Seen:
    state: SandboxState
    egress: EgressPolicy | None
    ttl_s: int | None
    persistent: bool

    @classmethod
    def of(cls, sandbox: Sandbox) -> Seen:
        return cls(sandbox.state, sandbox.egress, sandbox.ttl_s, sandbox.persistent)


def _rules(rules: list[str]) -> str:
    shown = ", ".join(rules[:MAX_RULES_SHOWN])
    return shown + (f" and {len(rules) - MAX_RULES_SHOWN} more" if len(rules) > MAX_RULES_SHOWN else "")


def describe_policy(policy: EgressPolicy | None) -> str:
    if policy is None:
        return "nothing allowed"
    parts = [f"default {policy.default}"]
    if policy.allow:
        parts.append(f"allow {_rules(policy.allow)}")
    if policy.deny:
        parts.append(f"deny {_rules(policy.deny)}")
    if policy.ports:
        parts.append(f"ports {_rules([str(p) for p in policy.ports])}")
    return "; ".join(parts)


def _started(sandbox: Sandbox) -> str:
    if sandbox.adopted:
        kept = "its VM kept running" if sandbox.state.live else "its image kept on the host"
        return f"adopted by a restarted agent: {kept} ({sandbox.state.value})"
    if sandbox.boot_mode == "cold":
        return f"started: cold-booted from a copy of its parent's disk in {sandbox.boot_ms:.0f} ms"
    source = f"snapshot {sandbox.from_snapshot}" if sandbox.from_snapshot else f"template {sandbox.template}"
    return (
        f"started: restored from {source} in {sandbox.boot_ms:.0f} ms ({sandbox.cpus} vCPU, {sandbox.memory_mib} MiB)"
    )


TRANSITIONS: dict[tuple[SandboxState, SandboxState], str] = {
    (SandboxState.RUNNING, SandboxState.PAUSED): "paused: its vCPUs are stopped",
    (SandboxState.PAUSED, SandboxState.RUNNING): "resumed",
    (SandboxState.RUNNING, SandboxState.HIBERNATED): "hibernated: memory and disk saved on the host, its VM stopped",
    (SandboxState.PAUSED, SandboxState.HIBERNATED): "hibernated: memory and disk saved on the host, its VM stopped",
    (SandboxState.HIBERNATED, SandboxState.RUNNING): "woken from hibernation",
}


def describe(before: Seen | None, sandbox: Sandbox) -> list[tuple[LogLevel, str]]:
    """The lines telling what changed from ``before`` (``None``: first seen) to ``sandbox`` now."""
    after = Seen.of(sandbox)
    if before is None:
        if after.state is SandboxState.HIBERNATED and not sandbox.adopted:
            return [("info", "taken over by this host while hibernated")]
        if after.state is SandboxState.ERROR:
            return [("error", "failed to start")]
        return [("info", _started(sandbox))]
    lines: list[tuple[LogLevel, str]] = []
    if after.state != before.state:
        said = TRANSITIONS.get((before.state, after.state))
        if after.state is SandboxState.ERROR:
            lines.append(("error", f"failed while {before.state.value}"))
        else:
            lines.append(("info", said or f"now {after.state.value} (was {before.state.value})"))
    if after.egress != before.egress:
        lines.append(("info", f"network policy changed: {describe_policy(after.egress)}"))
    if after.ttl_s != before.ttl_s:
        said = f"timeout set to {after.ttl_s} s of idleness" if after.ttl_s is not None else "timeout removed"
        lines.append(("info", said))
    if after.persistent != before.persistent:
        lines.append(("info", "made persistent: it never expires" if after.persistent else "no longer persistent"))
    return lines


class Journal:
    def __init__(self, book: LogBook, clock: Callable[[], float]) -> None:
        self.book = book
        self.clock = clock
        self._seen: dict[str, Seen] = {}

    def changed(self, sandbox: Sandbox) -> None:
        """The service recorded ``sandbox``: write what changed since last time."""
        now = self.clock()
        for level, message in describe(self._seen.get(sandbox.id), sandbox):
            self.book.add(sandbox.id, now, level, "agent", message)
        self._seen[sandbox.id] = Seen.of(sandbox)

    def note(self, sandbox_id: str, level: LogLevel, message: str) -> None:
        """Any other line of the agent's about the sandbox."""
        self.book.add(sandbox_id, self.clock(), level, "agent", message)

    def keep_only(self, sandbox_ids: Iterable[str]) -> None:
        wanted = set(sandbox_ids)
        for gone in [k for k in self._seen if k not in wanted]:
            del self._seen[gone]
