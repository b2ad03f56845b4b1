"""One QEMU microVM process, its QMP connection (through ``qemu.qmp``) and its guest-agent connection.

Lifecycle (``@require`` guards every transition)::

    CREATED --start(incoming=False)--> RUNNING <--pause/resume--> PAUSED
    CREATED --start(incoming=True)---> INCOMING --restore(vmstate[, prepare])--> RUNNING
    RUNNING|PAUSED --save_state(path)--> SAVED          (QEMU idles in postmigrate; kill it next)
    any --kill()--> KILLED                               (idempotent)
    any --detach()--> KILLED                             (connections closed, QEMU left running for the next agent)

A VM started by an earlier agent process is taken over with :meth:`MicroVM.adopted` (pid + process start time)
and :meth:`MicroVM.reconnect` (QMP and guest sockets; the state is what QMP reports), which a restarted agent runs
after it serves (:mod:`cryobox.agent.host.adopt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from qemu.qmp import ExecuteError, QMPClient, QMPError

from ...errors import GuestError, StateError, VmmError
from ...util.procfs import process_start_ticks
from ...util.system import scrubbed_env
from ..guest.client import GuestClient
from .jail import VmJail
from .machine import MachineConfig, MemoryBacking, NetAttach, VmPaths, qemu_argv
from .readiness import GuestReadiness
from .states import VmState, require
from .vmstream import config_prefix
from .volumes import AttachedVolume

log = logging.getLogger(__name__)
FDSET_BASE = 1 << 20
FDSET_SPAN = (1 << 31) - 1 - FDSET_BASE
"""Fd set ids :meth:`MicroVM.stage_fd` picks from: above the small ones QEMU assigns itself, below 2^31."""
PREFIX_READ = 4096  # the file header and configuration section of a vmstate are ~80 bytes
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


async def _poll(predicate: Callable[[], bool], timeout: float, what: str, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if not alive():
            raise VmmError(f"QEMU exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise VmmError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(0.003)


class MicroVM:
    def __init__(
        self,
        vm_id: str,
        config: MachineConfig,
        paths: VmPaths,
        memory: MemoryBacking,
        disk: Path,
        net: NetAttach | None = None,
        jail: VmJail | None = None,
        data_disks: tuple[Path, ...] = (),
    ) -> None:
        self.vm_id = vm_id
        self.data_disks = data_disks
        """Raw writable disks after the root disk (a template build's target filesystem); never snapshotted."""
        self.jail = jail
        """Where QEMU runs confined (its uid, namespaces, cgroup); ``None`` runs it as this process's user."""
        self.net = net
        self.config = config
        self.paths = paths
        self.memory = memory
        self.disk = disk
        self.state = VmState.CREATED
        self.log = log.getChild(vm_id)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self.start_ticks: int | None = None
        """The QEMU process's start time (``/proc/<pid>/stat``): with the pid, what names it across restarts."""
        self._qmp: QMPClient | None = None
        self.state_prefix: bytes | None = None
        """The configuration section of the vmstate this VM was restored from (:func:`.vmstream.config_prefix`):
        what a device-state capture needs to be loadable (``None``: not restored by this process)."""
        self.commands: frozenset[str] | None = None
        """QMP commands this QEMU has (``query-commands``, asked once:
        :func:`cryobox.agent.snapshot.devstate.saves_devices`)."""
        self.volumes: tuple[AttachedVolume, ...] = ()
        """The volumes its slots point at (:func:`.volumes.attach_volumes`)."""
        self.volume_doorbell = False
        """Its volume doorbell node exists (:func:`.volumes.ensure_doorbell`)."""
        self.guest: GuestClient | None = None
        self.readiness: GuestReadiness | None = None
        """Set on a VM adopted from an earlier agent until its guest has answered (:mod:`.readiness`): guest calls
        wait for it."""
        self.rejoined_as: str | None = None
        """The instance id its guest rejoined as while it warmed in the pool, in the slot it has (its neighbours and
        caches flushed there, its RNG reseeded after it was cloned): the sandbox it becomes keeps it
        (:func:`cryobox.agent.sandbox.fidelity.rejoin` ``rejoined``). Cleared when a create takes it."""
        self.violation: str | None = None
        """Why the VM was killed for breaking the guest protocol, if it was."""
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"MicroVM({self.vm_id!r}, {self.state.value}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self._pid

    def alive(self) -> bool:
        """QEMU still runs (our child: not reaped; adopted: same pid and start time)."""
        if self._proc is not None:
            return self._proc.poll() is None
        return (
            self._pid is not None
            and self.start_ticks is not None
            and process_start_ticks(self._pid) == self.start_ticks
        )

    @classmethod
    def adopted(
        cls,
        vm_id: str,
        config: MachineConfig,
        paths: VmPaths,
        memory: MemoryBacking,
        disk: Path,
        net: NetAttach | None,
        *,
        pid: int,
        start_ticks: int,
        jail: VmJail | None = None,
    ) -> MicroVM:
        """A QEMU an earlier agent started, held by pid and start time; :meth:`reconnect` reads its run state
        (``PAUSED`` until then; :meth:`kill` works from here on).

        :raises VmmError: the process is not the recorded one.
        """
        vm = cls(vm_id, config, paths, memory, disk, net, jail)
        vm._pid, vm.start_ticks = pid, start_ticks
        if not vm.alive():
            raise VmmError(f"QEMU {pid} of VM {vm_id} is gone")
        vm.state = VmState.PAUSED
        return vm

    async def reconnect(self, timeout: float = 5.0) -> VmState:
        """Connect QMP and the guest agent's port of an :meth:`adopted` VM; returns its run state.

        :raises VmmError: QMP does not answer (what was connected is closed again; :meth:`kill` still works).
        """
        try:
            self._qmp = await self._connect_qmp(time.monotonic() + timeout)
            status = await self.execute("query-status")
            self.state = VmState.RUNNING if status.get("status") == "running" else VmState.PAUSED
            await self.open_guest(timeout)
        except BaseException:
            await self._close_connections()
            raise
        return self.state

    @property
    def qmp(self) -> QMPClient:
        if self._qmp is None:
            raise StateError("QMP is not connected", state=self.state.value, required="incoming|running")
        return self._qmp

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run a QMP command; QMP failures become :class:`VmmError` (the one translation point)."""
        try:
            return await self.qmp.execute(command, arguments)
        except ExecuteError as err:
            raise VmmError(f"QMP {command} failed: {err}", details={"class": err.error_class}) from err
        except (QMPError, OSError, EOFError) as err:
            if self.state is VmState.KILLED or not self.alive():  # a delete (or a crash) got there first
                raise StateError(
                    f"VM {self.vm_id} is gone (QMP {command} could not finish)", state="stopped", required="running"
                ) from err
            raise VmmError(f"QMP {command} failed: {err!r}") from err

    def qemu_log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.paths.qemu_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @require(VmState.CREATED)
    async def start(self, *, incoming: bool, timeout: float = 20.0) -> None:
        """Spawn QEMU and connect QMP. With ``incoming`` it waits in ``-incoming defer`` for :meth:`restore`.

        :raises VmmError: QEMU failed to start (the message carries the tail of its log).
        """
        for sock in (self.paths.qmp, self.paths.agent):
            if len(str(sock)) > MAX_UNIX_PATH:
                raise VmmError(f"unix socket path {sock} is longer than {MAX_UNIX_PATH} bytes; use a shorter data dir")
        self.paths.root.mkdir(parents=True, exist_ok=True)
        argv = qemu_argv(
            self.config,
            self.paths,
            self.memory,
            self.disk,
            name=f"cryobox-{self.vm_id}",
            incoming=incoming,
            net=self.net,
            wrap=self.jail is None,  # the jail enters the netns itself
            data_disks=self.data_disks,
        )
        if self.jail is not None:
            try:
                self._pid = await self.jail.launch(
                    self.vm_id,
                    argv,
                    self.config,
                    self.paths,
                    self.memory,
                    self.disk,
                    self.net,
                    self.paths.qemu_log,
                    data_disks=self.data_disks,
                )
            except VmmError as err:
                raise VmmError(f"{err.message}; QEMU log:\n{self.qemu_log_tail()}") from err
        else:
            with open(self.paths.qemu_log, "ab") as qemu_log:
                # its own session and no death signal: the VM outlives the agent (a restarted agent adopts it)
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=qemu_log,
                    stderr=qemu_log,
                    start_new_session=True,
                    env=scrubbed_env(minimal=True),  # none of the agent's secrets or store credentials
                )
            self._pid = self._proc.pid
        self.start_ticks = process_start_ticks(self._pid)
        self.state = VmState.INCOMING if incoming else VmState.RUNNING
        try:
            await _poll(self.paths.qmp.exists, timeout, "the QMP socket", self.alive)
            self._qmp = await self._connect_qmp(time.monotonic() + timeout)
        except VmmError as err:
            await self.kill()
            raise VmmError(f"{err.message}; QEMU log:\n{self.qemu_log_tail()}") from err
        except BaseException:
            await self.kill()
            raise

    async def _connect_qmp(self, deadline: float) -> QMPClient:
        """Connect QMP. The socket file appears at bind(), a moment before QEMU listens: retry refusals."""
        while True:
            qmp = QMPClient(self.vm_id)
            try:
                await qmp.connect(str(self.paths.qmp))
                return qmp
            except (QMPError, OSError) as err:
                if not self.alive() or time.monotonic() > deadline:
                    raise VmmError(f"cannot connect to QMP at {self.paths.qmp}: {err}") from err
                await asyncio.sleep(0.005)

    async def _migration(self, start: Awaitable[Any], timeout: float) -> None:
        """Run a migration command and wait for its MIGRATION event to report completion (or QEMU to die: a
        restore whose lazily paged RAM cannot be read kills QEMU with SIGBUS mid-load)."""

        async def completed(listener: Any) -> None:
            async for event in listener:
                status = cast(dict[str, Any], event["data"])["status"]
                if status == "completed":
                    return
                if status in ("failed", "cancelled"):
                    raise VmmError(f"migration {status}; see {self.paths.qemu_log}")

        with self.qmp.listener("MIGRATION") as listener:
            await start
            waiter = asyncio.ensure_future(completed(listener))
            try:
                async with asyncio.timeout(timeout):
                    while not waiter.done():
                        if not self.alive():
                            raise VmmError(f"QEMU exited during the migration; see {self.paths.qemu_log}")
                        await asyncio.wait({waiter}, timeout=0.05)
                waiter.result()
            finally:
                waiter.cancel()

    async def _set_capabilities(self) -> None:
        await self.execute(
            "migrate-set-capabilities",
            {
                "capabilities": [
                    {"capability": "x-ignore-shared", "state": True},
                    {"capability": "events", "state": True},
                ]
            },
        )

    async def _pass_fd(self, fd: int, name: str) -> str:
        """Hand QEMU a file descriptor (SCM_RIGHTS + ``getfd``); returns the ``fd:`` migration URI naming it.
        A jailed QEMU cannot open our files, and its seccomp filter forbids the ``exec:`` URIs' fork."""
        self.qmp.send_fd_scm(fd)
        await self.execute("getfd", {"fdname": name})
        return f"fd:{name}"

    def stage_fd(self, fd: int, opaque: str) -> tuple[int, tuple[str, dict[str, Any]]]:
        """Send QEMU a copy of ``fd`` now (SCM_RIGHTS) and return a new fd set's id with the ``add-fd`` command
        that files it there, to be sent next, in the same pipeline as the commands that open ``/dev/fdset/<id>``
        (one round trip, not two). The id is ours, random, not QEMU's next free one: a set still held by a
        node is never added to, even by an agent that adopted this QEMU; QEMU parses it as a positive int."""
        self.qmp.send_fd_scm(fd)
        fdset = FDSET_BASE + secrets.randbelow(FDSET_SPAN)
        return fdset, ("add-fd", {"fdset-id": fdset, "opaque": opaque})

    async def add_fd(self, fd: int, opaque: str) -> int:
        """Hand QEMU a copy of ``fd`` as a new fd set (SCM_RIGHTS + ``add-fd``); returns the set's id, which QEMU
        opens as ``/dev/fdset/<id>`` (a jailed QEMU can open no file of ours by its path)."""
        self.qmp.send_fd_scm(fd)
        return int((await self.execute("add-fd", {"opaque": opaque}))["fdset-id"])

    @require(VmState.INCOMING)
    async def restore(
        self, vmstate: Path, timeout: float = 60.0, *, prepare: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """Load device state; RAM comes from the ``share=off`` memory image. ``prepare`` runs once the state is
        loaded, before the vCPUs start (volumes join there: :mod:`.volumes`). Ends RUNNING."""
        await self._set_capabilities()
        with open(vmstate, "rb") as state:
            head = state.read(PREFIX_READ)
            state.seek(0)
            uri = await self._pass_fd(state.fileno(), "cryobox-state")
            await self._migration(self.execute("migrate-incoming", {"uri": uri}), timeout)
        try:
            self.state_prefix = config_prefix(head)
        except VmmError as err:
            self.log.warning("no configuration section in %s (%s): snapshots stream all RAM", vmstate, err.message)
        if prepare is not None:
            await prepare()
        await self.execute("cont")
        self.state = VmState.RUNNING

    @require(VmState.RUNNING)
    async def pause(self) -> None:
        await self.execute("stop")
        self.state = VmState.PAUSED

    @require(VmState.PAUSED)
    async def resume(self) -> None:
        await self.execute("cont")
        self.state = VmState.RUNNING

    @require(VmState.RUNNING, VmState.PAUSED)
    async def save_state(self, vmstate: Path, timeout: float = 120.0) -> None:
        """Stop the guest and write its device state (shared RAM is skipped: it already is the file)."""
        if self.state is VmState.RUNNING:
            await self.pause()
        await self._set_capabilities()
        with open(vmstate, "wb") as state:
            uri = await self._pass_fd(state.fileno(), "cryobox-state")
            await self._migration(self.execute("migrate", {"uri": uri}), timeout)
        self.state = VmState.SAVED

    async def connect_guest(self, timeout: float = 10.0) -> GuestClient:
        """Open the host end of the guest-agent port (the socket exists as soon as QEMU is up); on an adopted VM,
        once its guest is known to answer."""
        if self.readiness is not None:
            await self.readiness.wait()
        return await self.open_guest(timeout)

    async def open_guest(self, timeout: float = 10.0) -> GuestClient:
        """The guest-agent port's connection, opened if need be, not waiting for the guest to be known to answer
        (what an adoption uses to find out: :meth:`wait_guest_ready`)."""
        if self.guest is not None and not self.guest.closed:
            return self.guest
        await _poll(self.paths.agent.exists, timeout, "the agent socket", self.alive)
        self.guest = await GuestClient.connect(self.paths.agent, self.vm_id, self._guest_violation)
        return self.guest

    def _guest_violation(self, reason: str) -> None:
        """The guest broke the host-guest protocol (hostile or broken): kill its VM, never block on it."""
        self.log.error("guest of VM %s broke the protocol (%s): killing the VM", self.vm_id, reason)
        self.violation = reason
        task = asyncio.get_running_loop().create_task(self.kill(), name=f"kill-{self.vm_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_guest_ready(self, timeout: float, ping_timeout: float = 0.5) -> dict[str, Any]:
        """Ping the guest agent until it answers (pings sent before the guest opens its port are lost)."""
        guest = await self.open_guest()
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise VmmError(f"QEMU exited before the guest agent answered; see {self.paths.console_log}")
            try:
                return await guest.ping(timeout=min(ping_timeout, max(0.05, deadline - time.monotonic())))
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise GuestError(f"guest agent did not answer within {timeout:.0f}s") from None

    async def kill(self) -> None:
        """Stop QEMU for good. Idempotent; safe from any state."""
        if self.state is VmState.KILLED:
            return
        self.state = VmState.KILLED
        self._unready("its VM was stopped")
        if self.guest is not None:
            await self.guest.aclose()
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            await asyncio.to_thread(self._proc.wait)
        elif self._proc is None and self._pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            await _poll(lambda: not self.alive(), 10.0, f"QEMU {self._pid} to exit", lambda: True)
        await self._disconnect_qmp()
        if self.jail is not None:
            await asyncio.to_thread(self.jail.release, self.vm_id)

    async def detach(self) -> None:
        """Close our connections and leave QEMU running (an agent stopping with ``--on-stop keep``)."""
        if self.state is VmState.KILLED:
            return
        self.state = VmState.KILLED
        self._unready("the agent is stopping")
        await self._close_connections()

    async def _close_connections(self) -> None:
        """Close the guest agent's and QMP's connections (QEMU runs on)."""
        if self.guest is not None:
            await self.guest.aclose()
            self.guest = None
        await self._disconnect_qmp()
        self._qmp = None

    def _unready(self, why: str) -> None:
        """Guest calls still waiting for an adopted guest will not get it (see :mod:`.readiness`)."""
        if self.readiness is not None:
            self.readiness.settle(VmmError(why))

    async def _disconnect_qmp(self) -> None:
        if self._qmp is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._qmp.disconnect()
