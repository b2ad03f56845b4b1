"""The guest's view of its memory and root disk: parsed from ``/proc/meminfo``, ``/sys/block/vda/size`` and
ext4's ``mb_groups`` as the guest kernel writes them, leniently and within bounds; read through the guest agent's
file read with the limits that keep a legitimate guest from breaking the protocol."""

from __future__ import annotations

from typing import Any

import pytest

from cryobox.agent.observe import guestview
from cryobox.agent.observe.guestview import (
    GuestDisk,
    GuestMemory,
    block_size,
    disk_usage,
    parse_free_blocks,
    parse_meminfo,
    read_device_bytes,
    read_disk,
    read_memory,
)
from cryobox.errors import GuestError
from cryobox.util.encoding import b64

MEMINFO = "MemTotal:        1000 kB\nMemFree:          100 kB\nMemAvailable:     600 kB\nCached:           250 kB\n"
ORDERS = "  ".join(f"2^{i}" for i in range(14))
MB_GROUPS = (  # as the guest kernel writes it (one line per block group, buddy counts after the bracket)
    f"#group: free  frags first [ {ORDERS} ]\n"
    f"#0    : 1000  3     100   [ {'0 ' * 14}]\n"
    f"#1    : 32768 1     0     [ {'0 ' * 13}4 ]\n"
    "#2    : I/O error\n"
)
GIB = 1 << 30


def test_meminfo() -> None:
    assert parse_meminfo(MEMINFO) == GuestMemory(total=1000 * 1024, used=400 * 1024, cache=250 * 1024)
    old_kernel = "MemTotal: 1000 kB\nMemFree: 300 kB\n"
    assert parse_meminfo(old_kernel) == GuestMemory(1000 * 1024, 700 * 1024, 0)
    assert parse_meminfo("MemTotal: 100 kB\nMemAvailable: 900 kB\n") == GuestMemory(102400, 0, 0)  # lies clamp
    assert parse_meminfo("garbage") is None and parse_meminfo("MemTotal: x kB\nMemFree: 1 kB") is None


def test_mb_groups_and_block_size() -> None:
    assert parse_free_blocks(MB_GROUPS) == (3, 33768)
    assert parse_free_blocks("#group: free\n") is None
    assert block_size(2 * GIB, 16) == 4096  # 128 MiB groups
    assert block_size(2 * GIB, 256) == 1024  # 8 MiB groups
    assert block_size(2 * GIB, 3) == 4096  # nothing fits: mke2fs's default
    assert disk_usage(2 * GIB, 16, 262144) == GuestDisk(total=2 * GIB, used=GIB)
    assert disk_usage(GIB, 8, 10**9) == GuestDisk(total=GIB, used=0)  # a guest claiming more free than exists


class FileGuest:
    def __init__(self, files: dict[str, str], fail: bool = False) -> None:
        self.files = files
        self.fail = fail
        self.asked: list[tuple[str, int]] = []

    async def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None, max_reply: int = 0
    ) -> dict[str, Any]:
        assert op == "read_file" and args is not None and timeout == 2.0
        self.asked.append((args["path"], max_reply))
        if self.fail:
            raise GuestError("the guest does not answer")
        return {"content": b64(self.files[args["path"]].encode())}


async def test_reads_through_the_guests_file_read() -> None:
    guest = FileGuest({guestview.MEMINFO: MEMINFO, guestview.ROOT_SIZE: "4194304\n", guestview.ROOT_GROUPS: MB_GROUPS})
    assert await read_memory(guest, 2.0) == GuestMemory(1000 * 1024, 400 * 1024, 250 * 1024)
    device = await read_device_bytes(guest, 2.0)
    assert device == 2 * GIB
    disk = await read_disk(guest, 2 * GIB, 2.0)
    assert disk == disk_usage(2 * GIB, 3, 33768)
    assert guest.asked == [
        (guestview.MEMINFO, guestview.SMALL_REPLY),
        (guestview.ROOT_SIZE, guestview.SMALL_REPLY),
        (guestview.ROOT_GROUPS, guestview.GROUPS_REPLY),
    ]
    with pytest.raises(GuestError):
        await read_memory(FileGuest({}, fail=True), 2.0)
