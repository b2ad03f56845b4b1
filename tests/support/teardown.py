"""Last-resort cleanup of everything a ``cryobox serve``/``agent`` with one data dir may leave running (its
VMs outlive it by design): every process naming the data dir, the memory server's mount, the volume, the hot
directory, network namespaces and the nft table of its tag."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from cryobox.agent.net.netlink import reclaim as reclaim_net
from cryobox.agent.net.slots import tag_for
from cryobox.bench.server import release_serve_state


def processes_naming(path: Path) -> list[int]:
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def reclaim_data_dir(data_dir: Path, cache_dir: Path | None) -> None:
    pids = processes_naming(data_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    release_serve_state(data_dir, cache_dir)
    tag = tag_for(data_dir)
    reclaim_net(tag)
    subprocess.run(["nft", "delete", "table", "inet", f"cryobox_{tag}"], capture_output=True, check=False)
