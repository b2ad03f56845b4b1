"""The QEMU command line for one microVM, derived from a frozen machine config.

A snapshot restores only into a QEMU with the same device list, so everything that shapes the device model
lives in :class:`MachineConfig`, and :meth:`MachineConfig.identity` is part of every template generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...image.agentdisk import AGENT_DEVICE
from . import qemu
from .accel import Accel
from .slots import VolumeSlot, device_name, slot_args, volume_slots

GUEST_MAC = "02:cb:00:00:00:02"


@dataclass(frozen=True)
class NetAttach:
    """Where a VM's NIC plugs in: a tap inside a network namespace (QEMU is started inside it)."""

    netns: str
    tap: str = "tap0"

    def netdev(self) -> str:
        # vnet_hdr=off: the guest negotiates the same virtio-net features whatever backend the template was
        # baked with, so a snapshot restores onto any slot's tap
        return f"tap,id=net0,ifname={self.tap},script=no,downscript=no,vnet_hdr=off"

    def wrapper(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"]


# A NIC attached to nothing reachable, for VMs started without a slot (tests of the driver alone). Bakes and
# sandboxes always use a tap: a snapshot taken with this backend carries a "slirp" section a tap cannot load.
UNPLUGGED_NETDEV = "user,id=net0,restrict=on"


@dataclass(frozen=True)
class MachineConfig:
    memory_mib: int
    cpus: int
    accel: Accel
    kernel: Path
    initrd: Path
    tsc_khz: int
    norandmaps: bool
    nic: bool = False
    """A virtio-net device with the guest identity every sandbox shares (MAC ``GUEST_MAC``)."""
    agent_disk: Path | None = None
    """The read-only agent disk (:mod:`cryobox.image.agentdisk`), the second virtio disk of every VM of the
    template (the guest's ``/dev/vdb``, named on the kernel command line): bake, restores, forks and wakes all
    get it at the same place, so their device lists match the snapshot's."""
    rw_volume_slots: int = 0
    ro_volume_slots: int = 0
    """Empty virtio disks baked after every other device, which a volume is pointed at before a restored guest
    runs (:mod:`.slots`, :mod:`.volumes`): read-write ones, then read-only ones."""

    @property
    def volume_slots(self) -> tuple[VolumeSlot, ...]:
        return volume_slots(self.rw_volume_slots, self.ro_volume_slots)

    def slot_device(self, slot: VolumeSlot) -> str:
        """The guest's name of ``slot``'s disk (``vdc``): the root disk, the agent disk, then the slots in order
        (a VM with data disks has them before its slots: the guest then finds the slot by its serial)."""
        first = 2 if self.agent_disk is not None else 1
        return device_name(first + self.volume_slots.index(slot))

    @property
    def kernel_cmdline(self) -> str:
        parts = ["console=ttyS0", "quiet", "panic=-1", "reboot=t", "8250.nr_uarts=1", "i8042.noaux"]
        if self.accel.needs_legacy_timers:
            # Under TCG the guest's TSC is the host's, so it keeps time; but timer interrupts arrive late, so the
            # clocksource watchdog (jiffies) calls the TSC unstable and the kernel falls back to jiffies, whose
            # clock then runs ~8% slow (measured: -25 ms every 300 ms after a restore). Trust the TSC.
            parts += [f"tsc_early_khz={self.tsc_khz}", "tsc=reliable", "clocksource=tsc"]
        if self.norandmaps:
            parts.append("norandmaps")
        if self.agent_disk is not None:
            parts.append(f"cryobox.agentdisk={AGENT_DEVICE}")
        return " ".join(parts)

    @property
    def machine_arg(self) -> str:
        timers = "pit=on,pic=on,rtc=on" if self.accel.needs_legacy_timers else "pit=off,pic=off,rtc=on"
        roms = ",x-option-roms=off" if qemu.option_roms_off() else ""
        return f"microvm,{timers},isa-serial=on,acpi=on{roms},memory-backend=ram"

    def identity(self) -> dict[str, object]:
        """What a snapshot depends on (the device model and guest-visible CPU)."""
        return {
            "memory_mib": self.memory_mib,
            "cpus": self.cpus,
            "accel": self.accel.value,
            "machine": self.machine_arg,
            "cpu": self.accel.cpu_model,
            "cmdline": self.kernel_cmdline,
            **({"nic": GUEST_MAC} if self.nic else {}),
            **({"agent_disk": AGENT_DEVICE} if self.agent_disk is not None else {}),
            **({"volume_slots": slot_args(self.volume_slots)} if self.volume_slots else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """Everything needed to rebuild this config (kept in every snapshot manifest)."""
        return {
            "memory_mib": self.memory_mib,
            "cpus": self.cpus,
            "accel": self.accel.value,
            "kernel": str(self.kernel),
            "initrd": str(self.initrd),
            "tsc_khz": self.tsc_khz,
            "norandmaps": self.norandmaps,
            "nic": self.nic,
            **({"agent_disk": str(self.agent_disk)} if self.agent_disk is not None else {}),
            **(
                {"rw_volume_slots": self.rw_volume_slots, "ro_volume_slots": self.ro_volume_slots}
                if self.volume_slots
                else {}
            ),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineConfig:
        return cls(
            memory_mib=int(data["memory_mib"]),
            cpus=int(data["cpus"]),
            accel=Accel(data["accel"]),
            kernel=Path(data["kernel"]),
            initrd=Path(data["initrd"]),
            tsc_khz=int(data["tsc_khz"]),
            norandmaps=bool(data["norandmaps"]),
            nic=bool(data.get("nic", False)),
            agent_disk=Path(data["agent_disk"]) if data.get("agent_disk") else None,
            rw_volume_slots=int(data.get("rw_volume_slots", 0)),
            ro_volume_slots=int(data.get("ro_volume_slots", 0)),
        )

    def host_files(self) -> dict[str, str]:
        """The host paths in :meth:`to_json` (kernel, initrd, agent disk): what a manifest made on another host
        takes from this host's copy of the template."""
        return {
            "kernel": str(self.kernel),
            "initrd": str(self.initrd),
            **({"agent_disk": str(self.agent_disk)} if self.agent_disk is not None else {}),
        }


@dataclass(frozen=True)
class MemoryBacking:
    """Guest RAM as a file: ``share=True`` while baking (RAM lands in the file), ``share=False`` on restore
    (the image is mapped MAP_PRIVATE: lazy, copy-on-write, never modified, page cache shared by every restore)."""

    path: Path
    share: bool
    write_trackable: bool = True
    """userfaultfd can write-protect the mapping (tmpfs: yes; a FUSE file of the memory server: no), so a
    running VM can be snapshotted with ``background-snapshot``; otherwise it is paused for a plain migration."""
    origin: Path | None = None
    """The durable file ``path`` is a copy of (a template's or snapshot's ``memory``), if there is one: a
    snapshot of the VM is then written as the pages that differ from it (``store/memlayer.py``)."""


@dataclass(frozen=True)
class VmPaths:
    """Files of one VM, all inside its run directory (reclaimed wholesale at agent start)."""

    root: Path

    @property
    def qmp(self) -> Path:
        return self.root / "qmp.sock"

    @property
    def agent(self) -> Path:
        return self.root / "agent.sock"

    @property
    def console_log(self) -> Path:
        return self.root / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.root / "qemu.log"

    @property
    def pidfile(self) -> Path:
        return self.root / "qemu.pid"

    @property
    def disk(self) -> Path:
        return self.root / "disk.qcow2"


def agent_disk_args(config: MachineConfig) -> list[str]:
    """The agent disk right after the root disk (the guest's vdb), read-only, shared by every VM mapping it."""
    if config.agent_disk is None:
        return []
    drive = f"id=agent,file={config.agent_disk},format=raw,if=none,readonly=on,cache=writeback"
    return ["-drive", drive, "-device", "virtio-blk-device,drive=agent"]


def qemu_argv(
    config: MachineConfig,
    paths: VmPaths,
    memory: MemoryBacking,
    disk: Path,
    *,
    name: str,
    incoming: bool,
    net: NetAttach | None = None,
    wrap: bool = True,
    data_disks: tuple[Path, ...] = (),
) -> list[str]:
    backing = f"memory-backend-file,id=ram,size={config.memory_mib}M,mem-path={memory.path}"
    if memory.share:
        backing += ",share=on"
    elif qemu.private_readonly():
        backing += ",share=off,readonly=on,rom=off"  # opened read-only: QEMU cannot write a shared image
    else:
        backing += ",share=off"
    argv = [
        *(net.wrapper() if net is not None and wrap else []),
        qemu.binary(),
        *qemu.firmware_args(),
        "-name",
        name,
        "-M",
        config.machine_arg,
        "-accel",
        config.accel.qemu_accel,
        "-cpu",
        config.accel.cpu_model,
        "-smp",
        str(config.cpus),
        "-m",
        f"{config.memory_mib}M",
        "-object",
        backing,
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(config.kernel),
        "-initrd",
        str(config.initrd),
        "-append",
        config.kernel_cmdline,
        "-drive",
        f"id=root,file={disk},format=qcow2,if=none,cache=unsafe,discard=unmap",
        "-device",
        "virtio-blk-device,drive=root",
        *agent_disk_args(config),
        "-device",
        "virtio-serial-device",
        "-chardev",
        f"socket,id=agent,path={paths.agent},server=on,wait=off",
        "-device",
        "virtserialport,chardev=agent,name=cryobox.agent",
        "-object",
        "rng-random,id=rng,filename=/dev/urandom",
        "-device",
        "virtio-rng-device,rng=rng",
        "-chardev",
        f"file,id=console,path={paths.console_log},append=on",  # cut under QEMU by .consolelog.cap
        "-serial",
        "chardev:console",
        "-chardev",
        f"socket,id=qmp,path={paths.qmp},server=on,wait=off",
        "-mon",
        "chardev=qmp,mode=control",
        "-pidfile",
        str(paths.pidfile),
    ]
    for index, data in enumerate(data_disks):  # writable, after the root (and agent) disk: vdb, vdc, ...
        fmt = "qcow2" if data.suffix == ".qcow2" else "raw"  # a build's target is a chain of qcow2 step layers
        argv += [
            "-drive",
            f"id=data{index},file={data},format={fmt},if=none,cache=writeback",
            "-device",
            f"virtio-blk-device,drive=data{index}",
        ]
    if config.nic:
        netdev = net.netdev() if net is not None else UNPLUGGED_NETDEV
        argv += ["-netdev", netdev, "-device", f"virtio-net-device,netdev=net0,mac={GUEST_MAC}"]
    argv += slot_args(config.volume_slots)  # last: every other device keeps the transport it had before slots
    if incoming:
        argv += ["-S", "-incoming", "defer"]
    return argv
