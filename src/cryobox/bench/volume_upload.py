"""Detach-upload of a volume: how long :func:`~cryobox.agent.volumes.transfer.store_volume` takes to store a
volume image after part of it changed (the cost a move adds on the source), on a ``file://`` store.

The image is filled with random bytes (every 4 MiB chunk distinct and non-zero: the worst case for a first
store), stored once, then ``changed`` of it is rewritten with new random bytes (in ``block``-sized writes at
random block-aligned offsets) and stored again: only the chunks those writes touched go up.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from ..agent.volumes.transfer import store_volume
from ..objstore.client import open_store
from ..objstore.leases import LeaseTiming

VOLUME_ID = "vol-0000000bench"


def measure(size: int = 1 << 30, changed: float = 0.10, block: int = 4 << 20, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cbx-volbench-") as tmp:
        work = Path(tmp)
        image = work / f"{VOLUME_ID}.ext4"
        with open(image, "wb") as f:
            for _ in range(size // (4 << 20)):
                f.write(os.urandom(4 << 20))
            os.fsync(f.fileno())
        store = open_store(f"file://{work / 'store'}")
        timing = LeaseTiming(settle_s=0)
        first = store_volume(store, VOLUME_ID, image, timing)
        blocks = size // block
        touched = rng.sample(range(blocks), max(1, int(blocks * changed)))
        with open(image, "r+b") as f:
            for i in touched:
                f.seek(i * block)
                f.write(os.urandom(block))
            os.fsync(f.fileno())
        started = time.monotonic()
        second = store_volume(store, VOLUME_ID, image, timing)
        wall = time.monotonic() - started
        unchanged = store_volume(store, VOLUME_ID, image, timing)
    return {
        "size_bytes": size,
        "changed_fraction": changed,
        "write_block_bytes": block,
        "first_store": {"seconds": round(first.seconds, 3), "uploaded_bytes": first.uploaded_bytes},
        "detach_upload": {
            "seconds": round(wall, 3),
            "uploaded_bytes": second.uploaded_bytes,
            "chunks_put": second.chunks_put,
            "chunks_reused": second.chunks_reused,
        },
        "unchanged_store": {"seconds": round(unchanged.seconds, 3), "uploaded_bytes": unchanged.uploaded_bytes},
    }


if __name__ == "__main__":
    print(json.dumps({"4MiB writes": measure(), "1MiB writes": measure(block=1 << 20)}, indent=2))
