"""A jail per QEMU, in the spirit of Firecracker's jailer (DESIGN §7).

Each VM's QEMU runs

- as its own unprivileged uid/gid (no supplementary groups; every capability
  gone, the bounding set empty, ``no_new_privs``), from a range per data dir: a sandbox's uid is
  ``uid_base + slot index`` and its tap is handed to that uid (``TUNSETOWNER``) as QEMU starts;
- in new mount, PID and IPC namespaces: its root is a 1 MiB tmpfs holding bind mounts of exactly its own
  files at their own paths — ``/usr`` and the loader cache (read-only, for the binary and its libraries; a
  private QEMU's prefix too, ``CRYOBOX_QEMU``),
  the kernel and initrd, its disk's backing chain and its memory image (read-only: QEMU opens a private
  image ``readonly=on,rom=off``, so it cannot write a hot copy other VMs map), its run directory (sockets,
  logs, its overlay) and the device nodes it needs (``null``, ``urandom``, ``net/tun``, ``kvm``, and a
  ``userfaultfd`` node of its own for background snapshots);
- under seccomp (``-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny``: no
  ``exec:`` migration URIs, so state goes through ``fd:``) with an empty environment;
- in a cgroup (:mod:`.cgroups`) capping its memory (guest RAM plus QEMU's own overhead), CPU (its vCPUs plus
  one core for QEMU's own threads, :data:`QEMU_THREADS_CPUS`) and tasks.

Under TCG the guest-to-host boundary is QEMU's instruction emulator, which upstream does not treat as a
security boundary (https://www.qemu.org/docs/master/system/security.html): the jail is what stands between a
TCG escape and the host, and ``/v1/info`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...errors import HostUnavailable, InvalidArgument, VmmError
from ..disk.qcow2 import backing_chain
from . import qemu
from .accel import Accel
from .cgroups import CgroupHost, Limits
from .machine import MachineConfig, MemoryBacking, NetAttach, VmPaths

LAUNCHER = Path(__file__).with_name("jailexec.py")
SANDBOX_ARGS = ["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]
UID_RANGE = 65536
SLOT_UIDS = 64512
"""uids ``base .. base+SLOT_UIDS-1`` belong to network slots; the rest to VMs without one (bakes, tests)."""
EXTRA_UIDS = UID_RANGE - SLOT_UIDS - 1  # the last id of the range is the image group
DEFAULT_UID_FLOOR = 1_000_000
ENV_JAIL = "CRYOBOX_JAIL"
ENV_UID_BASE = "CRYOBOX_JAIL_UID_BASE"
OVERHEAD_MIB = {Accel.TCG: 384, Accel.KVM: 192}
"""QEMU's own memory beyond guest RAM (TCG: a 64 MiB translation cache, code and buffers; measured peaks in
docs/SPECIFICATION.md, "Isolation")."""
PIDS_MAX = 256
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
TUN = Path("/dev/net/tun")
KVM = Path("/dev/kvm")
KNOWN_NODES = {"/dev/userfaultfd": (10, 257), "/dev/net/tun": (10, 200), "/dev/kvm": (10, 232)}
_UNSAFE = re.compile(r"[\t\n]")


def jail_enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV_JAIL, "on").strip().lower()
    if value not in ("on", "off", "1", "0", "true", "false"):
        raise InvalidArgument(f"{ENV_JAIL} must be on or off, not {value!r}", details={"env": ENV_JAIL})
    return value in ("on", "1", "true")


def default_uid_base(tag: str) -> int:
    """A range of its own per data dir (by its network tag), so agents sharing a host never share a uid."""
    return DEFAULT_UID_FLOOR + (int(tag, 16) % 32000) * UID_RANGE


@dataclass(frozen=True)
class JailSettings:
    """One agent's jail configuration: its uid range, its cgroups, how the launcher runs."""

    uid_base: int
    cgroups: CgroupHost | None
    python: str = sys.executable

    @classmethod
    def for_tag(cls, tag: str, env: Mapping[str, str] | None = None) -> JailSettings | None:
        """The jail for data dir ``tag``, or ``None`` with ``CRYOBOX_JAIL=off``."""
        source = os.environ if env is None else env
        if not jail_enabled(source):
            return None
        raw = source.get(ENV_UID_BASE, "").strip()
        try:
            base = int(raw) if raw else default_uid_base(tag)
        except ValueError:
            raise InvalidArgument(f"{ENV_UID_BASE} must be an integer, not {raw!r}") from None
        if not 1000 <= base <= (1 << 31) - UID_RANGE:
            raise InvalidArgument(f"{ENV_UID_BASE}={base} is outside 1000..{(1 << 31) - UID_RANGE}")
        return cls(uid_base=base, cgroups=CgroupHost.detect(tag))

    @property
    def uid_range(self) -> range:
        return range(self.uid_base, self.uid_base + UID_RANGE)

    def slot_uid(self, index: int) -> int:
        if not 0 <= index < SLOT_UIDS:
            raise VmmError(f"slot index {index} has no jail uid (at most {SLOT_UIDS} slots per data dir)")
        return self.uid_base + index

    @property
    def image_gid(self) -> int:
        """The group of shared memory images a QEMU older than 8.2 must open read-write (the range's last id)."""
        return self.uid_base + UID_RANGE - 1

    def extra_uid(self, index: int) -> int:
        if not 0 <= index < EXTRA_UIDS:
            raise VmmError(f"no jail uid left for VMs without a slot (index {index})")
        return self.uid_base + SLOT_UIDS + index

    def describe(self) -> dict[str, object]:
        return {
            "enabled": True,
            "uids": f"{self.uid_base}-{self.uid_base + UID_RANGE - 1}",
            "cgroup": None if self.cgroups is None else f"v{self.cgroups.version}",
            "seccomp": True,
            "namespaces": ["mount", "pid", "ipc", "net"],
        }


ONE_OFF_UIDS = 16
"""uids at the top of the extra range for bake and build VMs: each holds one exclusively while it runs."""


@contextlib.contextmanager
def one_off_uid(settings: JailSettings | None, lock_dir: Path) -> Iterator[int | None]:
    """A uid for a bake or a build VM that no other running one holds (a ``flock`` per uid under ``lock_dir``:
    concurrent bakes and builds of every process on this data dir never share a uid). ``None`` without a jail.

    :raises HostUnavailable: all :data:`ONE_OFF_UIDS` are held.
    """
    if settings is None:
        yield None
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    for k in range(ONE_OFF_UIDS):
        with open(lock_dir / f".uid-{k}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            yield settings.extra_uid(EXTRA_UIDS - 1 - k)
            return
    raise HostUnavailable(f"all {ONE_OFF_UIDS} jail uids for bakes and builds are in use; try again later")


def _device_numbers(node: Path) -> tuple[int, int]:
    try:
        rdev = os.stat(node).st_rdev
        return os.major(rdev), os.minor(rdev)
    except OSError:
        return KNOWN_NODES[str(node)]


QEMU_THREADS_CPUS = 1.0
"""CPU beyond the vCPUs a VM's quota allows for QEMU's own threads (main loop, I/O, a restore's incoming
migration). Measured with 0.5: restores were throttled, +14 % on the spawned-pool create p50 over no jail
against +4 % with the quota out of the way (``cryobox bench create``, two runs each, 2 cores, TCG)."""


def limits_for(config: MachineConfig) -> Limits:
    memory = (config.memory_mib + OVERHEAD_MIB[config.accel]) << 20
    return Limits(memory_bytes=memory, cpus=config.cpus + QEMU_THREADS_CPUS, pids=PIDS_MAX)


@dataclass(frozen=True)
class VmJail:
    """The jail of one VM: its uid (= gid) under ``settings``."""

    settings: JailSettings
    uid: int

    def spec(
        self,
        config: MachineConfig,
        paths: VmPaths,
        memory: MemoryBacking,
        disk: Path,
        net: NetAttach | None,
        data_disks: tuple[Path, ...] = (),
    ) -> list[list[str]]:
        binds: list[tuple[Path, str]] = [
            (Path("/usr"), "ro"),
            (Path("/etc/ld.so.cache"), "ro"),
            *([(prefix, "ro")] if (prefix := qemu.install_prefix()) is not None else []),
            (config.kernel, "ro"),
            (config.initrd, "ro"),
            *([(config.agent_disk, "ro")] if config.agent_disk is not None else []),
            (memory.path, "rw" if memory.share or not qemu.private_readonly() else "ro"),
            (paths.root, "rw"),
        ]
        if not disk.is_relative_to(paths.root):
            binds.append((disk, "rw"))
        binds += [(p, "ro") for p in backing_chain(disk)]
        binds += [(p, "rw") for p in data_disks if not p.is_relative_to(paths.root)]
        binds += [
            (p, "ro")
            for d in data_disks
            if d.suffix == ".qcow2"
            for p in backing_chain(d)
            if not p.is_relative_to(paths.root)
        ]
        spec: list[list[str]] = [["root", str(paths.root / "jail")]]
        if net is not None:
            spec += [["netns", f"/run/netns/{net.netns}"], ["tap", net.tap]]
        spec += [["bind", str(path), mode] for path, mode in binds]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = Path("/") / link
            if target.is_symlink():
                spec.append(["symlink", os.readlink(target), str(target)])
            elif target.is_dir():
                spec.append(["bind", str(target), "ro"])
        spec += [["dev", d] for d in DEVICES]
        # nodes of its own, owned by its uid (mode 0600): the host's may be root-only (here /dev/net/tun is)
        owned = [
            Path("/dev/userfaultfd"),
            *([TUN] if net is not None else []),
            *([KVM] if config.accel is Accel.KVM else []),
        ]
        for node in owned:
            major, minor = _device_numbers(node)
            spec.append(["mknod", str(node), str(major), str(minor)])
        spec += [["uid", str(self.uid)], ["gid", str(self.uid)]]
        if not memory.share:  # a restore's image: a hot file of the group (QEMU < 8.2), or a memory server file
            spec.append(["groups", str(self.settings.image_gid)])
        for fields in spec:
            if any(_UNSAFE.search(f) for f in fields):
                raise VmmError(f"jail path {fields!r} contains a tab or newline")
        return spec

    def prepare(self, paths: VmPaths, memory: MemoryBacking, disk: Path, data_disks: tuple[Path, ...] = ()) -> None:
        """Hand the VM's writable files to its uid (the run dir, its overlay, a shared RAM file, data disks)."""
        (paths.root / "jail").mkdir(exist_ok=True)
        os.chown(paths.root, self.uid, self.uid)
        for path in (disk, *data_disks, *([memory.path] if memory.share else [])):
            os.chown(path, self.uid, self.uid)
        if not memory.share:
            # the shared image goes to the image group: QEMU < 8.2 opens even a private RAM file read-write
            # (0660), 8.2+ read-only (0640); a FUSE file of the memory server refuses chown (its server already
            # admits every uid)
            with contextlib.suppress(OSError):
                os.chown(memory.path, -1, self.settings.image_gid)
                os.chmod(memory.path, 0o640 if qemu.private_readonly() else 0o660)

    async def launch(
        self,
        vm_id: str,
        argv: list[str],
        config: MachineConfig,
        paths: VmPaths,
        memory: MemoryBacking,
        disk: Path,
        net: NetAttach | None,
        log_path: Path,
        *,
        data_disks: tuple[Path, ...] = (),
    ) -> int:
        """Start ``argv`` (QEMU, without a netns wrapper) jailed; returns its pid as this host sees it.

        :raises VmmError: the jail or QEMU's exec failed (the message says which step).
        """
        spec = self.spec(config, paths, memory, disk, net, data_disks)
        self.prepare(paths, memory, disk, data_disks)
        cgroups = self.settings.cgroups
        if cgroups is not None:
            spec += [["cgroup", str(p)] for p in await asyncio.to_thread(cgroups.create, vm_id, limits_for(config))]
        spec_path = paths.root / "jail.spec"
        spec_path.write_text("".join("\t".join(fields) + "\n" for fields in spec))
        binary = shutil.which(argv[0]) or argv[0]
        command = [self.settings.python, "-I", "-S", str(LAUNCHER), str(spec_path), "--", binary, *argv[1:]]
        command += SANDBOX_ARGS
        with open(log_path, "ab") as qemu_log:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=qemu_log, start_new_session=True
            )
            try:
                out, _ = await proc.communicate()
            except BaseException:
                # cancelled (a stopping agent, a pool shrinking): the launcher runs on and forks QEMU, whose pid
                # no one would learn; let it finish, then kill what its cgroup holds
                await asyncio.shield(asyncio.create_task(self._abandon(proc, vm_id)))
                raise
        if proc.returncode != 0:
            self.release(vm_id)
            raise VmmError(f"jailed QEMU did not start (launcher exit {proc.returncode}); see {log_path}")
        return int(out.decode().strip())

    async def _abandon(self, proc: asyncio.subprocess.Process, vm_id: str) -> None:
        """Stop what a launch nobody waits for any more started: the launcher (a fork and an exec, then it exits)
        and the QEMU it leaves in the VM's cgroup."""
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        cgroups = self.settings.cgroups
        if cgroups is not None:
            await asyncio.to_thread(cgroups.kill, vm_id)
            await asyncio.to_thread(self.release, vm_id)

    def release(self, vm_id: str, wait_s: float = 2.0) -> None:
        """Remove the VM's cgroup once its QEMU is gone. A dead QEMU stays a member until its parent (init,
        since the launcher exited) reaps it, so this waits briefly; a cgroup still busy after that is left to
        the next start's reclaim (or ``cryobox gc``)."""
        cgroups = self.settings.cgroups
        if cgroups is None:
            return
        deadline = time.monotonic() + wait_s
        while not cgroups.remove(vm_id) and time.monotonic() < deadline:
            time.sleep(0.01)


def prepare_host(settings: JailSettings, sysctl: Path = Path("/proc/sys/vm/unprivileged_userfaultfd")) -> list[str]:
    """Host settings jailed QEMUs need; returns what it weakened, for ``/v1/info`` and the start banner.

    QEMU older than 8.1 creates its userfaultfd (background snapshots) with the syscall, which an unprivileged
    process may use only with ``vm.unprivileged_userfaultfd=1``; 8.1+ opens the jail's own ``/dev/userfaultfd``.
    """
    weakened: list[str] = []
    if qemu.version() < (8, 1):
        try:
            if sysctl.read_text().strip() != "1":
                sysctl.write_text("1")
            weakened.append("vm.unprivileged_userfaultfd=1 (QEMU < 8.1 has no /dev/userfaultfd support)")
        except OSError as err:
            raise VmmError(f"jailed QEMU {qemu.version_line()} needs {sysctl} = 1: {err}") from err
    if not qemu.private_readonly():
        weakened.append("shared memory images are writable by the VMs mapping them (QEMU < 8.2 has no rom=off)")
    return weakened
