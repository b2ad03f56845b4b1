"""Volume slots: empty virtio-blk devices every template is baked with, so that a volume can join a restored guest.

microvm has no hot-plug, and a snapshot restores only into a QEMU with the device list it was taken with. So the
device a volume will use exists at bake time, empty, and :mod:`.volumes` points it at the volume's image while the
restored guest's vCPUs are still stopped (docs/design/volumes.md).

A slot is a ``null-co`` node of size 0 (the guest can never read, so never cache, a block of it) under a
``virtio-blk-device`` with a QOM id (``/machine/peripheral/vol-rw0``: what the re-pointing names) and a serial
(``cbx-vol-rw0``: what the guest agent checks before it mounts the device). Read-only slots are baked read-only:
the guest negotiated ``VIRTIO_BLK_F_RO`` at boot, so its kernel refuses every write to them, whatever root in the
guest does, and QEMU opens their volumes read-only. ``write-cache=on``: the guest sees a volatile write cache and
sends a flush for every ``fsync``, which QEMU turns into an ``fdatasync`` of the image (:mod:`.volumes`).
"""

from __future__ import annotations

from dataclasses import dataclass

RW_SLOTS = 4
RO_SLOTS = 4
"""Slots per template machine. Measured on the TCG host: QEMU start-up with 0, 4, 8 and 16 empty slots, p50 of 30
each, 38.7 / 38.2 / 38.7 / 41.1 ms; a warm-pool create (which never starts a QEMU) does not see them at all.
microvm with ACPI has 24 virtio-mmio transports and the machine uses 4 (5 with an agent disk), so 8 slots leave
11 or 12 for devices to come. Changing either number changes every template's generation (a re-bake)."""
SERIAL_PREFIX = "cbx-"
MAX_SERIAL = 20  # VIRTIO_BLK_ID_BYTES


@dataclass(frozen=True)
class VolumeSlot:
    read_only: bool
    index: int

    @property
    def id(self) -> str:
        """The device's QOM id (``/machine/peripheral/<id>``)."""
        return f"vol-{'ro' if self.read_only else 'rw'}{self.index}"

    @property
    def serial(self) -> str:
        """What the guest reads in ``/sys/block/vdX/serial``."""
        return SERIAL_PREFIX + self.id

    @property
    def empty_node(self) -> str:
        """The baked ``null-co`` node (what the slot points at when no volume is attached)."""
        return f"{self.id}-empty"

    @property
    def volume_node(self) -> str:
        """The node of the volume attached to this slot."""
        return f"{self.id}-volume"

    @property
    def qom_path(self) -> str:
        return f"/machine/peripheral/{self.id}"


def volume_slots(rw: int, ro: int) -> tuple[VolumeSlot, ...]:
    """The slots of a machine, in device order: the read-write ones, then the read-only ones."""
    return (*(VolumeSlot(False, i) for i in range(rw)), *(VolumeSlot(True, i) for i in range(ro)))


def slot_args(slots: tuple[VolumeSlot, ...]) -> list[str]:
    """The QEMU arguments of ``slots``."""
    argv: list[str] = []
    for slot in slots:
        readonly = ",read-only=on" if slot.read_only else ""
        argv += [
            "-blockdev",
            f"driver=null-co,node-name={slot.empty_node},size=0,read-zeroes=on{readonly}",
            "-device",
            f"virtio-blk-device,drive={slot.empty_node},id={slot.id},serial={slot.serial},write-cache=on",
        ]
    return argv


def device_name(index: int) -> str:
    """The guest's name of its ``index``-th virtio disk (0: ``vda``, 25: ``vdz``, 26: ``vdaa``), as the kernel's
    ``virtblk_name_format`` makes it."""
    if index < 0:
        raise ValueError(f"disk index {index} is negative")
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return f"vd{letters}"
