"""The control plane's view of its host agents: who they are, whether they are alive, how to reach them.

Agents register and heartbeat (:meth:`Fleet.heartbeat`: from ``POST /internal/v1/heartbeat`` for HTTP agents,
from a loop in ``cryobox serve`` for the in-process one). Everything lives in the registry (``agents`` rows), so
any control-plane replica can route to any agent and a restarted one knows the fleet at once. An agent whose
heartbeats stop for longer than the deadline is marked ``down`` and its sandboxes ``lost`` (:meth:`check_stale`,
run by every replica: it is idempotent). When an agent registers with a new boot id, or comes back after being
down, its own report of what it runs is authoritative for the rows of its host, and only those
(:meth:`_reconcile`). A hibernated sandbox whose image is in the object store is portable: :meth:`route` has the
``relocator`` (:class:`~.hibernations.HibernationControl`) wake it elsewhere when its host is draining, down or
lacks it, before the request goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ...agentapi import Agent, HttpAgent
from ...agentapi import models as am
from ...errors import CryoboxError, HostUnavailable, NotFound, StateError
from ...registry import HIBERNATED, HIBERNATION_STORED, AgentRow, Registry, SandboxRow
from ...registry.watch import watch_sandboxes
from .routecache import RouteCache
from .strays import delete_strays

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_HEARTBEAT_INTERVAL_S = 2.0
DEFAULT_DEADLINE_S = 10.0
ROW_CACHE_S = 1.0
RegisterHook = Callable[[str, am.Heartbeat], Awaitable[None]]
Relocator = Callable[[SandboxRow], Awaitable[SandboxRow]]
Waker = Callable[[SandboxRow, Agent], Awaitable[SandboxRow]]


@dataclass
class FleetConfig:
    deadline_s: float = DEFAULT_DEADLINE_S
    """Heartbeats missed for this long: the agent is ``down``, its sandboxes ``lost``."""
    node_token: str = ""
    """What HTTP agents present (and what the control plane presents to them)."""
    agent_timeout_s: float = 600.0


@dataclass
class Fleet:
    registry: Registry
    config: FleetConfig = field(default_factory=FleetConfig)
    clock: Callable[[], float] = time.time
    local: dict[str, Agent] = field(default_factory=dict)
    """In-process agents by name (``cryobox serve`` has one); the rest are reached over HTTP."""
    _clients: dict[str, tuple[str, HttpAgent]] = field(default_factory=dict)
    _rows: dict[str, tuple[float, AgentRow]] = field(default_factory=dict)
    """Agent rows read in the last ``ROW_CACHE_S`` (a routed call costs no registry read for its agent;
    liveness is still judged against the row's heartbeat time, so a silent agent is refused all the same)."""
    _on_register: list[RegisterHook] = field(default_factory=list)
    _started_at: float = field(default=0.0, init=False)
    relocator: Relocator | None = None
    """Given the row of a sandbox hibernated in the object store, the row of where it runs now (woken on
    another agent when its own is draining, down or lacks it); set by the control plane."""
    waker: Waker | None = None
    """Given a hibernated row and its agent, wakes it there (inside the workspace's quota) and returns the row;
    set by the control plane, used by :meth:`route` with ``wake``."""

    routes: RouteCache = field(init=False)
    """Rows of running sandboxes read in the last second: a guest call's route (:meth:`on_guest`)."""
    _unwatch: Callable[[], None] = field(init=False)

    def __post_init__(self) -> None:
        self._started_at = self.clock()
        self.routes = RouteCache(self.clock)
        self._unwatch = watch_sandboxes(self.registry.database, self.routes.forget)

    def on_register(self, hook: RegisterHook) -> None:
        """Run ``hook(name, heartbeat)`` after an agent registered (new boot) or came back and was reconciled."""
        self._on_register.append(hook)

    def forget_row(self, name: str) -> None:
        """Drop the cached row of agent ``name`` (its status just changed)."""
        self._rows.pop(name, None)

    async def agents(self) -> list[AgentRow]:
        return await asyncio.to_thread(self.registry.fleet.list_agents)

    def is_alive(self, row: AgentRow) -> bool:
        return row.status in ("up", "draining") and row.heartbeat_at >= self.alive_after()

    async def alive(self, name: str) -> bool:
        """Agent ``name`` is registered and alive (:meth:`is_alive` of its row, cached as :meth:`agent_row`)."""
        try:
            return self.is_alive(await self.agent_row(name))
        except HostUnavailable:
            return False

    def _trusted_after_start(self, row: AgentRow) -> bool:
        """In this process's first ``deadline_s`` an ``up`` row's silence is this process's own absence (its agents'
        heartbeats could not reach it while it was down), not theirs: a request is routed by the row's status (a
        dead agent then fails at the transport, a 503 all the same). A restarted control plane answered its first
        requests to every remote agent's sandboxes with 503 until each agent's next heartbeat."""
        return row.status in ("up", "draining") and self.clock() - self._started_at < self.config.deadline_s

    def alive_after(self) -> float:
        """The oldest heartbeat time that still counts as alive now."""
        return self.clock() - self.config.deadline_s

    async def agent(self, name: str) -> Agent:
        """The transport to agent ``name``; ``HostUnavailable`` (503) when it is unknown, down or silent."""
        local = self.local.get(name)
        if local is not None:
            return local
        row = await self.agent_row(name)
        if not self.is_alive(row) and not self._trusted_after_start(row):
            raise HostUnavailable(
                f"agent {name!r} is {row.status if row.status != 'up' else 'not answering heartbeats'}",
                retry_after_s=self.config.deadline_s,
                details={"agent": name, "status": row.status},
            )
        return self._client(row)

    async def agent_row(self, name: str) -> AgentRow:
        """Agent ``name``'s registry row, read at most once per :data:`ROW_CACHE_S` (heartbeats are seconds
        apart: a fresher read would say nothing newer); ``HostUnavailable`` when it is not registered."""
        cached = self._rows.get(name)
        if cached is not None and cached[0] > self.clock():
            return cached[1]
        try:
            row = await asyncio.to_thread(self.registry.fleet.get_agent, name)
        except Exception:
            raise HostUnavailable(f"agent {name!r} is not registered", details={"agent": name}) from None
        self._rows[name] = (self.clock() + ROW_CACHE_S, row)
        return row

    def _client(self, row: AgentRow) -> HttpAgent:
        cached = self._clients.get(row.name)
        if cached is not None and cached[0] == row.url:
            return cached[1]
        client = HttpAgent(row.url, self.config.node_token, timeout_s=self.config.agent_timeout_s, name=row.name)
        self._clients[row.name] = (row.url, client)
        if cached is not None:
            asyncio.get_running_loop().create_task(cached[1].close())
        return client

    async def route(
        self, sandbox_id: str, workspace_id: str | None, *, wake: bool = False, explicit: bool = False
    ) -> tuple[SandboxRow, Agent]:
        """The sandbox's row and its agent (404 across workspaces; 409 when it is lost, stopped or failed). With
        ``wake`` a hibernated sandbox is woken (by the ``waker``) before the caller's request reaches it — when
        its row's ``auto_wake`` says so or the caller resumes it ``explicit``-ly; 409 ``hibernated`` otherwise,
        before anything moves. A running row read is kept a second for :meth:`on_guest`."""
        generation = self.routes.generation()
        row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)
        self.routes.put(row, generation)
        if wake and row.status == HIBERNATED and not (row.auto_wake or explicit):
            raise StateError(
                f"sandbox {sandbox_id} is hibernated (paused) and does not wake on requests: resume it first",
                state=HIBERNATED,
                required="running",
                details={"auto_wake": False},
            )
        if row.status == "lost":
            raise StateError(
                f"sandbox {sandbox_id} is lost: its agent {row.host!r} stopped answering",
                state="lost",
                required="running",
                details={"host": row.host},
            )
        if row.status in ("stopped", "error"):
            raise StateError(f"sandbox {sandbox_id} is {row.status}", state=row.status, required="running")
        if self.relocator is not None and row.status == HIBERNATED and row.hibernation == HIBERNATION_STORED:
            row = await self.relocator(row)
        agent = await self.agent(row.host)
        if wake and self.waker is not None and row.status == HIBERNATED:
            row = await self.waker(row, agent)
        return row, agent

    async def on_guest(self, sandbox_id: str, workspace_id: str | None, call: Callable[[Agent], Awaitable[T]]) -> T:
        """``call`` made with the agent of the sandbox (woken first if need be, as :meth:`route` with ``wake``),
        routed without a registry read when its running row was read in the last second (:mod:`.routecache`). An
        agent found that way that answers it does not run the sandbox (not found, or in another state: another
        replica moved or hibernated it meanwhile) does not have the last word: the sandbox is routed again from
        the registry, and if that finds it elsewhere or otherwise, ``call`` is made there. Only for calls that an
        agent refuses before doing anything (an exec: "not found" and "hibernated" are answered first)."""
        hit = self.routes.get(sandbox_id, workspace_id)
        if hit is None:
            return await call((await self.route(sandbox_id, workspace_id, wake=True))[1])
        try:
            return await call(await self.agent(hit.host))
        except (NotFound, StateError):
            self.routes.forget(frozenset({sandbox_id}))
            row, agent = await self.route(sandbox_id, workspace_id, wake=True)
            if row.host == hit.host and row.status == hit.status:
                raise
            return await call(agent)

    async def live_agents(self) -> list[tuple[AgentRow, Agent]]:
        out = []
        for row in await self.agents():
            if self.is_alive(row):
                out.append((row, self.local.get(row.name) or self._client(row)))
        return out

    async def refresh_capacity(self, name: str, agent: Agent) -> None:
        """Record what ``agent`` reports it can serve now, without waiting for its next heartbeat."""
        capacity = (await agent.capacity()).model_dump()
        await asyncio.to_thread(self.registry.fleet.update_capacity, name, capacity)
        self._rows.pop(name, None)

    async def heartbeat(self, hb: am.Heartbeat) -> am.HeartbeatReply:
        name = hb.agent.name
        outcome = await asyncio.to_thread(
            lambda: self.registry.fleet.heartbeat(
                name,
                url=hb.agent.url,
                boot_id=hb.agent.boot_id,
                capacity=hb.capacity.model_dump(),
                info=hb.agent.model_dump(),
                now=self.clock(),
            )
        )
        self._rows.pop(name, None)
        reported = {s.id: s.state for s in hb.sandboxes}
        if outcome.new_boot or outcome.was_down:
            await self._reconcile(name, hb, reported)
            await self._delete_strays(name, hb)
            for hook in self._on_register:
                try:
                    await hook(name, hb)
                except Exception:
                    log.exception("agent %s: registration hook failed", name)
            return am.HeartbeatReply(reconciled=True)
        # a normal beat only refreshes the states of what the agent reports (rows of sandboxes being created
        # or deleted right now may be ahead of or behind the report: absent rows are left alone)
        await self._refresh_states(name, reported)
        await self._delete_strays(name, hb)
        return am.HeartbeatReply()

    async def _refresh_states(self, name: str, reported: Mapping[str, str]) -> None:
        """Rows whose state the report contradicts get the agent's state *now*, each only if its row still says
        what it said when read: a report is a snapshot, and one taken just before a change this control plane made
        and recorded (a hibernation at the timeout) would otherwise undo it until the next beat (a command arriving
        meanwhile woke a sandbox that does not wake on requests: E2B's timeouts test, once)."""
        rows = await asyncio.to_thread(self.registry.fleet.host_statuses, name)
        contradicted = sorted(i for i, state in reported.items() if i in rows and rows[i] != state)
        if not contradicted:
            return
        agent = await self.agent(name)

        async def now(sandbox_id: str) -> str | None:
            try:
                return (await agent.get(sandbox_id)).state
            except CryoboxError:  # gone meanwhile: its delete settles the row
                return None

        states = await asyncio.gather(*(now(sandbox_id) for sandbox_id in contradicted))
        changes = {
            sandbox_id: state
            for sandbox_id, state in zip(contradicted, states, strict=True)
            if state is not None and state != rows[sandbox_id]
        }
        if changes:
            expected = {sandbox_id: rows[sandbox_id] for sandbox_id in changes}
            await asyncio.to_thread(
                lambda: self.registry.fleet.reconcile_host(name, changes, absent_status=None, expected=expected)
            )

    async def _delete_strays(self, name: str, hb: am.Heartbeat) -> None:
        """Sandboxes the agent runs with no row and no unexpired reservation go (:mod:`.strays`)."""
        try:
            await delete_strays(self.registry, name, await self.agent(name), hb.sandboxes, self.clock())
        except Exception:
            log.exception("agent %s: deleting unrecorded sandboxes failed", name)

    async def _reconcile(self, name: str, hb: am.Heartbeat, reported: Mapping[str, str]) -> None:
        local = set(hb.capacity.local_snapshots)
        report = await asyncio.to_thread(
            lambda: self.registry.fleet.reconcile_host(
                name, reported, snapshot_dir_exists=lambda path: path.rstrip("/").rsplit("/", 1)[-1] in local
            )
        )
        if report.lost or report.deleted_snapshots:
            log.info(
                "agent %s registered: %d sandbox row(s) lost, %d local snapshot row(s) without files removed",
                name,
                len(report.lost),
                len(report.deleted_snapshots),
            )

    async def check_stale(self) -> list[str]:
        """Agents silent past the deadline become ``down`` and their sandboxes ``lost``."""
        down = await asyncio.to_thread(self.registry.fleet.mark_stale, self.clock(), self.config.deadline_s)
        for name in down:
            self._rows.pop(name, None)
        for name in down:
            log.warning(
                "agent %s missed heartbeats for %.0fs: down, its sandboxes are lost", name, self.config.deadline_s
            )
        return down

    async def close(self) -> None:
        self._unwatch()
        for _, client in self._clients.values():
            await client.close()
        self._clients.clear()
