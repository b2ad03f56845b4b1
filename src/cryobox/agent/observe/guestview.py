"""The guest's own view of its memory and root disk, as E2B reports them, read through the guest agent's file
read (no process is started in the guest, nothing of the guest image changes):

- memory from ``/proc/meminfo``: used is ``MemTotal - MemAvailable``, cache is ``Cached``;
- the root disk's size from ``/sys/block/vda/size`` (512-byte sectors; read once per VM: it never changes), and its
  free space from ``/proc/fs/ext4/vda/mb_groups`` (the free blocks of every block group of the root ext4): used is
  size minus free (the file system's own metadata counts as used).

The guest may lie about all of this (it is its own view); what it answers is parsed with bounds and never trusted
for more than the figures of its own samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from ...util.encoding import unb64

MEMINFO = "/proc/meminfo"
ROOT_SIZE = "/sys/block/vda/size"
ROOT_GROUPS = "/proc/fs/ext4/vda/mb_groups"
SMALL_REPLY = 64 << 10
GROUPS_REPLY = 4 << 20
"""``mb_groups`` holds a line per 128 MiB block group: 4 MiB is a disk far larger than any template's."""
BLOCK_SIZES = (4096, 1024, 2048, 65536)
SECTOR = 512


class Guest(Protocol):
    async def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None, max_reply: int = ...
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class GuestMemory:
    total: int
    used: int
    cache: int


@dataclass(frozen=True)
class GuestDisk:
    total: int
    used: int


def parse_meminfo(text: str) -> GuestMemory | None:
    values: dict[str, int] = {}
    for line in text.splitlines()[:200]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name in ("MemTotal", "MemAvailable", "MemFree", "Cached") and fields and fields[0].isdigit():
            values[name] = int(fields[0]) * 1024
    total = values.get("MemTotal")
    available = values.get("MemAvailable", values.get("MemFree"))
    if total is None or available is None or total <= 0:
        return None
    used = min(total, max(0, total - available))
    return GuestMemory(total=total, used=used, cache=min(total, values.get("Cached", 0)))


def parse_free_blocks(text: str) -> tuple[int, int] | None:
    """``(groups, free blocks)`` of an ext4 ``mb_groups`` file (``#<group>: <free> <frags> <first> [ … ]``)."""
    groups = free = 0
    for line in text.splitlines():
        if not line.startswith("#") or not line[1:2].isdigit():
            continue  # the header (``#group: free …``)
        groups += 1
        fields = line.partition(":")[2].split()
        if fields and fields[0].isdigit():
            free += int(fields[0])
    return (groups, free) if groups else None


def block_size(device_bytes: int, groups: int) -> int:
    """The block size whose block groups (``8 × size`` blocks each) make ``groups`` of a ``device_bytes`` file
    system; 4 KiB when none fits exactly (mke2fs's default for anything but tiny disks)."""
    for size in BLOCK_SIZES:
        if math.ceil(device_bytes / (8 * size * size)) == groups:
            return size
    return BLOCK_SIZES[0]


def disk_usage(device_bytes: int, groups: int, free_blocks: int) -> GuestDisk:
    free = free_blocks * block_size(device_bytes, groups)
    return GuestDisk(total=device_bytes, used=max(0, device_bytes - min(free, device_bytes)))


async def read_text(guest: Guest, path: str, timeout_s: float, max_reply: int = SMALL_REPLY) -> str:
    """A small guest file as text (``GuestError`` and friends propagate: the caller skips the guest's view)."""
    reply = await guest.call("read_file", {"path": path}, timeout=timeout_s, max_reply=max_reply)
    return unb64(reply.get("content")).decode(errors="replace")


async def read_memory(guest: Guest, timeout_s: float) -> GuestMemory | None:
    return parse_meminfo(await read_text(guest, MEMINFO, timeout_s))


async def read_device_bytes(guest: Guest, timeout_s: float) -> int | None:
    text = (await read_text(guest, ROOT_SIZE, timeout_s)).strip()
    return int(text) * SECTOR if text.isdigit() else None


async def read_disk(guest: Guest, device_bytes: int, timeout_s: float) -> GuestDisk | None:
    parsed = parse_free_blocks(await read_text(guest, ROOT_GROUPS, timeout_s, GROUPS_REPLY))
    return disk_usage(device_bytes, *parsed) if parsed is not None else None
