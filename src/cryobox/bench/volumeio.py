"""In-guest I/O on a volume against the sandbox's own root disk (``cryobox bench volume``'s ``io`` part).

One sandbox with a read-write volume (an image the agent's volume store makes: allocated in full, ext4); in the
guest, for the volume's mount and a directory on the root
disk in turn, :data:`PROGRAM` measures, on a file of ``size_mib``:

- ``seq_write_mib_s``: 1 MiB writes of the whole file, then ``fdatasync`` (counted in);
- ``seq_read_mib_s``: 1 MiB reads of it with ``O_DIRECT`` (the guest's page cache bypassed);
- ``rand_write_iops``: ``ops`` 4 KiB writes at random aligned offsets with ``O_DIRECT``, then ``fdatasync``;
- ``rand_read_iops``: ``ops`` 4 KiB reads at random aligned offsets with ``O_DIRECT``.

The ratio ``volume / root`` of each is what the result is for: the two sit on the same host disk, behind the same
virtio-blk and QEMU block layer (the root disk is a qcow2 overlay, the volume a raw image).
"""

from __future__ import annotations

import json
from typing import Any

PROGRAM = r"""
import json, mmap, os, random, sys, time
path, size_mib, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
size = size_mib << 20
block = mmap.mmap(-1, 1 << 20)
block.write(os.urandom(1 << 20))
out = {}
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
t = time.monotonic()
for i in range(size_mib):
    os.pwrite(fd, block, i << 20)
os.fdatasync(fd)
out["seq_write_mib_s"] = size_mib / (time.monotonic() - t)
os.close(fd)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
t = time.monotonic()
for i in range(size_mib):
    os.preadv(fd, [block], i << 20)
out["seq_read_mib_s"] = size_mib / (time.monotonic() - t)
os.close(fd)
page = mmap.mmap(-1, 4096)
rng = random.Random(7)
offsets = [rng.randrange(size >> 12) << 12 for _ in range(ops)]
fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
t = time.monotonic()
for off in offsets:
    os.pwritev(fd, [page], off)
os.fdatasync(fd)
out["rand_write_iops"] = ops / (time.monotonic() - t)
os.close(fd)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
rng.shuffle(offsets)
t = time.monotonic()
for off in offsets:
    os.preadv(fd, [page], off)
out["rand_read_iops"] = ops / (time.monotonic() - t)
os.close(fd)
os.unlink(path)
print(json.dumps(out))
"""

KEYS = ("seq_write_mib_s", "seq_read_mib_s", "rand_write_iops", "rand_read_iops")


def command(path: str, size_mib: int, ops: int) -> str:
    """The shell command that runs :data:`PROGRAM` (given on stdin) on ``path``."""
    return f"python3 - {path} {size_mib} {ops}"


def parse(stdout: str) -> dict[str, float]:
    found = json.loads(stdout.strip().splitlines()[-1])
    return {k: round(float(found[k]), 1) for k in KEYS}


def summary(volume: list[dict[str, float]], root: list[dict[str, float]]) -> dict[str, Any]:
    """Medians of the runs on each, and the ratio volume / root of each figure."""

    def median(runs: list[dict[str, float]], key: str) -> float:
        values = sorted(r[key] for r in runs)
        return values[len(values) // 2]

    vol = {k: median(volume, k) for k in KEYS}
    base = {k: median(root, k) for k in KEYS}
    return {
        "volume": vol,
        "root_disk": base,
        "ratio_volume_to_root": {k: round(vol[k] / base[k], 2) if base[k] else None for k in KEYS},
        "runs": len(volume),
    }
