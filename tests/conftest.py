"""Session-wide guard: whatever the suite starts on this host, it must leave nothing behind.

The host's QEMU processes, network namespaces, nft tables, mounts, ``/dev/shm`` entries, VM cgroups and the template
cache's bakes are recorded when the session starts and compared when it ends (after every fixture's teardown):
anything new that is still there is a leak, and fails the run. The machine's shared object store is then swept of
what the suite's (now gone) data dirs stored in it. With ``pytest -n`` (pytest-xdist, as ``make test`` runs it)
only the controller checks, before its workers start and after all of them have finished, so one worker's live VMs
are never taken for the other's leaks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.teardown import (
    forget_owner_records,
    reclaim_dead_postgres,
    reclaim_previous_run,
    sweep_shared_store,
)

HostState = dict[str, set[str]]
BEFORE = pytest.StashKey[HostState]()
LEAKS = pytest.StashKey[dict[str, list[str]]]()
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
    memservers = {line.split(maxsplit=1)[0] for line in _lines(["pgrep", "-f", "cryobox.agent.memory.server.main"])}
    return {
        "qemu processes": qemus,
        "memory servers": memservers,
        "network namespaces": {line.split()[0] for line in _lines(["ip", "netns", "list"])},
        "nft tables": _lines(["nft", "list", "tables"]),
        "mounts": {" ".join(line.split()[:3]) for line in Path("/proc/self/mounts").read_text().splitlines()},
        "/dev/shm entries": {p.name for p in Path("/dev/shm").iterdir()},
        "cgroups": _vm_cgroups(),
        "template bakes": _test_bakes(),
        "host routing": _routing(),
    }


def _routing() -> set[str]:
    """The host's ``ip_forward`` and the records of forward-mode agents that turned it on: the last agent to stop
    puts it back, so after the run both are as before."""
    value = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    run = Path("/run/cryobox")
    records = {p.name for p in run.glob("ip_forward.*.was")} if run.is_dir() else set()
    return {f"ip_forward={value}", *records}


# bakes in the host's shared template cache that outlive a run on purpose: the built-ins' (every server uses them)
# and the capture test's template with pytest in it (its pip install needs PyPI; one per image generation)
KEPT_BAKES = ("base-", "code-interpreter-", "docker-", "capture-pytest-")


def _test_bakes() -> set[str]:
    """The template cache's bakes but the kept ones: a template a test builds is a test's to delete (its bake is
    ~160 MB in a cache no data dir's removal cleans)."""
    root = Path(os.environ.get("CRYOBOX_CACHE_DIR", "/var/cache/cryobox")) / "templates"
    if not root.is_dir():
        return set()
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", *KEPT_BAKES))}


def _vm_cgroups() -> set[str]:
    """Every per-agent cgroup directory the jail makes (``cryobox-<tag>``, at any depth) and the VMs in them."""
    found: set[str] = set()
    for base in Path("/sys/fs/cgroup").glob("**/cryobox-*"):
        found.add(str(base))
        found.update(str(child) for child in base.iterdir() if child.is_dir())
    return found


def leaks(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, list[str]]:
    return {kind: sorted(after[kind] - before[kind]) for kind in after if after[kind] - before[kind]}


def _checks(config: pytest.Config) -> bool:
    """The process that owns the run: a plain pytest, or xdist's controller (never one of its workers)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Before xdist's workers (or pytest itself) empty the base temp dir: reclaim what an interrupted earlier run
    left in it — a mount point there stops the whole run before its first test — and the directories of its
    throwaway PostgreSQL servers in /tmp."""
    basetemp = config.option.basetemp
    if _checks(config):
        gone = reclaim_previous_run(Path(basetemp)) if basetemp else []
        gone += [f"postgres dir {d}" for d in reclaim_dead_postgres(Path("/tmp"))]
        if gone:
            print(f"reclaimed from an earlier run: {', '.join(gone)}")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _checks(session.config):
        session.config.stash[BEFORE] = host_state()


def pytest_sessionfinish(session: pytest.Session) -> None:
    before = session.config.stash.get(BEFORE, None)
    if before is None or not _checks(session.config):
        return
    deadline = time.monotonic() + SETTLE_S
    while (found := leaks(before, host_state())) and time.monotonic() < deadline:
        time.sleep(0.5)
    if found:
        session.config.stash[LEAKS] = found
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    basetemp = session.config.option.basetemp
    if basetemp and session.exitstatus == pytest.ExitCode.OK and not _mounts_below(Path(basetemp)):
        # a passed run keeps none of its ~10 GiB of data dirs (a failed one keeps them to look at, until the next
        # run's start reclaims them): the disk is shared with the store and the images
        shutil.rmtree(basetemp, ignore_errors=True)
    if basetemp:  # what the suite's data dirs stored goes with them (a full disk stopped CI), and their records
        print(
            f"\n{sweep_shared_store()}; {forget_owner_records(Path(basetemp))} owner records of gone data dirs removed"
        )


def _mounts_below(root: Path) -> bool:
    prefix = f"{root.resolve()}/"
    return any(line.split()[1].startswith(prefix) for line in Path("/proc/self/mounts").read_text().splitlines())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    found = config.stash.get(LEAKS, None)
    if found:
        terminalreporter.section("left on the host", sep="=", red=True, bold=True)
        terminalreporter.write_line(f"FAILED: the test suite left these on the host: {found}", red=True)
