"""Session-wide guard: whatever the suite starts on this host, it must leave nothing behind.

The host's QEMU processes, network namespaces, nft tables, mounts, ``/dev/shm`` entries and VM cgroups are recorded when
the session starts and compared when it ends (after every other fixture's teardown): anything new that is
still there is a leak, and fails the run.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SETTLE_S = 15.0  # processes killed by a teardown may take a moment to be reaped
# VMs (and the memory server) outlive a stopped agent by default; every server or agent the suite starts stops
# with ``kill`` unless a test asks for ``keep`` (and then cleans up itself)
os.environ.setdefault("CRYOBOX_ON_STOP", "kill")


def _lines(argv: list[str]) -> set[str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.strip() for line in out.splitlines() if line.strip()}


def host_state() -> dict[str, set[str]]:
    qemus = {line.split(maxsplit=1)[0] for line in _lines(["pgrep", "-a", "qemu-system"])}
    memservers = {line.split(maxsplit=1)[0] for line in _lines(["pgrep", "-f", "cryobox.agent.store.memserver"])}
    return {
        "qemu processes": qemus,
        "memory servers": memservers,
        "network namespaces": {line.split()[0] for line in _lines(["ip", "netns", "list"])},
        "nft tables": _lines(["nft", "list", "tables"]),
        "mounts": {" ".join(line.split()[:3]) for line in Path("/proc/self/mounts").read_text().splitlines()},
        "/dev/shm entries": {p.name for p in Path("/dev/shm").iterdir()},
        "cgroups": _vm_cgroups(),
    }


def _vm_cgroups() -> set[str]:
    """Every per-agent cgroup directory the jail makes (``cryobox-<tag>``, at any depth) and the VMs in them."""
    found: set[str] = set()
    for base in Path("/sys/fs/cgroup").glob("**/cryobox-*"):
        found.add(str(base))
        found.update(str(child) for child in base.iterdir() if child.is_dir())
    return found


def leaks(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, list[str]]:
    return {kind: sorted(after[kind] - before[kind]) for kind in after if after[kind] - before[kind]}


@pytest.fixture(scope="session", autouse=True)
def nothing_left_on_the_host() -> Iterator[None]:
    before = host_state()
    yield
    deadline = time.monotonic() + SETTLE_S
    while (found := leaks(before, host_state())) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not found, f"the test suite left these on the host: {found}"
