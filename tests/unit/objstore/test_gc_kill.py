"""``kill -9`` a store GC at random instants: every live image stays whole, and a last run leaves exactly the
chunks live images name (a real file:// store; the GC runs in a forked child of a zygote that imported it once)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cryobox.objstore import owners
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.gc import GcPolicy, collect
from cryobox.objstore.gcscan import scan
from cryobox.registry.oracle import RegistryOracle, machine_id
from cryobox.server.control.ownership import StoreOwnership
from tests.support.registry import migrated, sandbox, snapshot
from tests.support.storegc import (
    HOUR,
    hours_later,
    live_problems,
    put_generation,
    put_image,
    put_orphan,
    referenced,
)

ROUNDS = 20
GONE = "gone-registry"
DELETE_LATENCY_S = 0.004  # every delete of the killed runs takes this long: a run lasts ~0.1-0.3 s

ZYGOTE = """
import os, sys, time
from cryobox.objstore.client import open_store
from cryobox.objstore.gc import GcClock, GcPolicy, collect
from cryobox.registry.oracle import RegistryOracle, machine_id

url, latency, mutant = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "mutant"
if mutant:  # the classic mistake: delete an image's objects before its manifest
    from cryobox.objstore import gc as storegc
    assert hasattr(storegc, "_manifest_first")
    storegc._manifest_first = lambda group: sorted(group.objects, key=lambda m: m.key.endswith("/manifest.json"))

class Slow:
    def __init__(self, inner):
        self.inner = inner
    def __getattr__(self, name):
        return getattr(self.inner, name)
    def delete(self, key):
        # the mutant lingers before each manifest, so a kill anywhere after its first early delete catches the
        # harm even when a loaded machine slows the run down (the real GC deletes manifests first: no window)
        time.sleep(latency + (1.0 if mutant and key.endswith("/manifest.json") else 0.0))
        self.inner.delete(key)

def run():
    store = Slow(open_store(url))
    oracle = RegistryOracle(machine_id())
    collect(store, GcPolicy(grace_s=3600), GcClock(wall=lambda: time.time() + 2 * 3600), oracle)
    os._exit(0)

print("ready", flush=True)
for line in sys.stdin:  # one line per GC run
    pid = os.fork()
    if pid == 0:
        try:
            run()
        finally:
            os._exit(4)
    print("pid", pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(status), flush=True)
"""


@contextmanager
def zygote(url: str, script: Path, *, mutant: bool = False) -> Iterator[subprocess.Popen[str]]:
    script.write_text(ZYGOTE)
    argv = [sys.executable, str(script), url, str(DELETE_LATENCY_S), "mutant" if mutant else "real"]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            yield proc
        finally:
            proc.kill()


def garbage(store: ObjectStore, work: Path, n: int) -> None:
    """What one round leaves to collect: a new generation (the oldest unreferenced one falls out of the newest
    two), orphan chunks, a publish that died without a manifest, a snapshot deleted half-way."""
    put_generation(store, work, f"g{n}", {0: b"kernel", 1: f"gen {n}".encode()}, time.time() - HOUR, latest=True)
    for name in ("disk.qcow2", "memory.trace"):
        store.put(f"templates/base/g{n}/{name}", name.encode())
    for k in range(8):
        put_orphan(store, f"orphan {n}.{k}".encode())
    put_image(store, work, f"snapshots/died{n}", {0: f"died {n}".encode(), 2: b"heap"}, None)
    put_image(store, work, f"snapshots/gone{n}", {0: b"kernel", 3: f"gone {n}".encode()}, {"template": "base"})
    store.delete(f"snapshots/gone{n}/manifest.json")
    put_image(store, work, f"snapshots/dis{n}", {0: b"kernel", 6: f"disowned {n}".encode()}, {"template": "base"})
    owners.claim(store, GONE, f"snapshots/dis{n}")  # its registry (a deleted data dir) is gone


def must_live(store: ObjectStore, n: int) -> list[str]:
    """The images no run may delete: the newest two generations, the one the snapshot sits on, the snapshot
    and the hibernation."""
    keys = set(store.list(""))
    wanted = [f"templates/base/g{n}", f"templates/base/g{n - 1}", "templates/base/g1", "snapshots/s1"]
    return [p for p in [*wanted, "hibernations/h1"] if f"{p}/manifest.json" not in keys]


def seeded(tmp_path: Path) -> tuple[str, ObjectStore, Path]:
    """A store holding the images every round must leave whole; ``s1`` and ``h1`` are claimed by a registry (a
    real SQLite file) that lists them, and a registry that is gone is announced."""
    url = f"file://{tmp_path / 'store'}"
    store = open_store(url)
    work = tmp_path / "work"
    put_generation(store, work, "g1", {0: b"kernel", 1: b"gen 1"}, time.time() - 3 * HOUR, latest=True)
    snap = {0: b"kernel", 1: b"gen 1", 4: b"snap"}
    put_image(store, work, "snapshots/s1", snap, {"template_prefix": "templates/base/g1"})
    put_image(store, work, "hibernations/h1", {0: b"kernel", 5: b"asleep"}, {"template": "base"})
    put_generation(store, work, "g2", {0: b"kernel", 1: b"gen 2"}, time.time() - 2 * HOUR, latest=True)
    for reg in migrated(f"sqlite:///{tmp_path / 'data' / 'registry.sqlite'}"):
        ws = reg.ensure_workspace("default").id
        reg.add_snapshot(snapshot("s1", ws))
        reg.add_sandbox(sandbox("h1", ws))
        ownership = StoreOwnership.announced(store, reg, machine_id())
        ownership.claim("snapshots/s1")
        ownership.claim("hibernations/h1")
    gone = tmp_path / "deleted" / "registry.sqlite"
    owners.announce(store, owners.RegistryRecord(GONE, "sqlite", str(gone), machine_id()))
    return url, store, work


def kill_rounds(
    proc: subprocess.Popen[str], store: ObjectStore, work: Path, *, stop_at_problem: bool, early: float
) -> list[str]:
    """Add garbage, start a GC run, SIGKILL it after a random delay, check the live images; ``ROUNDS`` times.
    A fraction ``early`` of the kills land in the first 40 ms (where image groups are deleted), the others any
    time in the first 250 ms (chunks come after). Returns the problems found (none: every image whole)."""
    assert proc.stdin is not None and proc.stdout is not None
    rng = random.Random(18)
    killed_mid_run = 0
    problems: list[str] = []
    for n in range(3, 3 + ROUNDS):
        garbage(store, work, n)
        proc.stdin.write("run\n")
        proc.stdin.flush()
        words = proc.stdout.readline().split()
        assert words[0] == "pid", words
        threading.Event().wait(rng.uniform(0.003, 0.04) if rng.random() < early else rng.uniform(0.01, 0.25))
        with contextlib.suppress(ProcessLookupError):  # the run may have finished (and been reaped)
            os.kill(int(words[1]), signal.SIGKILL)
        status = proc.stdout.readline().split()
        assert status[0] == "status" and status[1] in ("0", str(-signal.SIGKILL)), status
        killed_mid_run += status[1] == str(-signal.SIGKILL)
        problems += [f"round {n}: {p}" for p in live_problems(store)]
        problems += [f"round {n}: {p} is gone" for p in must_live(store, n)]
        if problems and stop_at_problem:
            return problems
    assert killed_mid_run >= ROUNDS // 2, f"only {killed_mid_run} of {ROUNDS} kills landed inside a run"
    return problems


@pytest.mark.timeout(180)
def test_kill_9_at_any_instant_leaves_every_live_image_whole(tmp_path: Path) -> None:
    url, store, work = seeded(tmp_path)
    with zygote(url, tmp_path / "zygote.py") as proc:
        assert kill_rounds(proc, store, work, stop_at_problem=False, early=0.5) == []

    report = collect(store, GcPolicy(grace_s=HOUR), hours_later(2), RegistryOracle(machine_id()))
    assert report.complete and report.chunks_missing == []
    assert live_problems(store) == []
    assert sorted(store.list("chunks")) == sorted(referenced(store)), "exactly the referenced chunks remain"
    view = scan(store)
    last = 3 + ROUNDS - 1
    kept = ["templates/base/g1", f"templates/base/g{last - 1}", f"templates/base/g{last}", "snapshots/s1"]
    assert sorted(view.groups) == sorted([*kept, "hibernations/h1"])
    assert all(g.has_manifest for g in view.groups.values()) and store.list("leases") == [] and store.list("gc") == []
    assert len(store.list("chunks")) == len(view.chunks) == 1 + 3 + 1 + 1  # kernel, 3 generations, snap, asleep


@pytest.mark.timeout(180)
def test_kill_9_harness_catches_a_gc_that_deletes_an_images_objects_before_its_manifest(tmp_path: Path) -> None:
    """The same harness against a GC that deletes a dead generation's index before its manifest must find a
    "live" image (its manifest still there) with its index gone."""
    url, store, work = seeded(tmp_path)
    with zygote(url, tmp_path / "zygote.py", mutant=True) as proc:
        problems = kill_rounds(proc, store, work, stop_at_problem=True, early=0.0)
    assert problems, "kills of a GC deleting manifests last went unnoticed"
