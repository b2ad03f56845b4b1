"""ChunkCache: PutDurable under kill -9, verification on read, allocated-bytes budget, LRU per chunk, restart,
content addressing (a chunk is one file however many images hold it)."""

from __future__ import annotations

import hashlib
import inspect
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cryobox.agent.memory.server.chunkcache import ChunkCache
from cryobox.errors import InvalidArgument, StateError
from cryobox.util.files import allocated_bytes
from tests.support.clock import FakeClock

KiB = 1 << 10
MiB = 1 << 20
START = 1_700_000_000.0
TICK_S = 100.0


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunk_data(image: int, idx: int) -> bytes:
    """The one content chunk ``idx`` of image ``image`` has in these tests (1 byte .. 768 KiB)."""
    rng = random.Random(f"{image}/{idx}")
    return rng.randbytes(rng.randrange(1, 768 * 1024))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def opened(root: Path, budget: int = 1 << 40, clock: FakeClock | None = None, **kw: float) -> ChunkCache:
    cache = ChunkCache(root, budget, clock or FakeClock(START), **kw)
    cache.open()
    return cache


def put(cache: ChunkCache, data: bytes) -> str:
    digest = sha(data)
    cache.put(digest, data)
    return digest


def test_put_get_contains_and_layout(tmp_path: Path) -> None:
    cache = opened(tmp_path / "cache")
    data = os.urandom(100 * KiB)
    digest = sha(data)
    assert cache.get(digest) is None and not cache.contains(digest)
    cache.put(digest, data)
    assert cache.contains(digest) and not cache.contains(sha(b"other"))
    assert cache.get(digest) == data
    assert (tmp_path / "cache" / digest[:2] / digest).read_bytes() == data
    assert cache.path(digest) == tmp_path / "cache" / digest[:2] / digest
    assert os.listdir(tmp_path / "cache" / digest[:2]) == [digest]  # no temp file left behind
    cache.put(digest, data)  # putting again replaces, accounting stays exact
    assert cache.used_bytes == allocated_bytes(tmp_path / "cache")
    s = cache.stats
    assert (s.hits, s.misses, s.puts, s.corrupt, s.evictions) == (1, 1, 2, 0, 0)


def test_a_chunk_is_one_file_whatever_image_it_came_from(tmp_path: Path) -> None:
    """Keyed by content: the bytes a template's restore cached are the hit for a snapshot holding them."""
    cache = opened(tmp_path)
    shared = os.urandom(64 * KiB)
    put(cache, shared)  # by the template's restore
    assert cache.get(sha(shared)) == shared  # by its snapshot's (same bytes, another image)
    assert [p.name for p in tmp_path.glob("*/*")] == [sha(shared)]
    assert cache.stats.hits == 1 and cache.stats.puts == 1


def test_corrupt_file_reads_as_miss_and_is_deleted(tmp_path: Path) -> None:
    cache = opened(tmp_path)
    data = os.urandom(64 * KiB)
    digest = put(cache, data)
    path = cache.path(digest)
    raw = bytearray(path.read_bytes())
    raw[1234] ^= 0x01
    path.write_bytes(bytes(raw))
    assert cache.get(digest) is None
    assert not path.exists() and not cache.contains(digest)
    assert cache.stats.corrupt == 1 and cache.used_bytes == 0
    assert cache.get(digest) is None  # now simply absent
    assert cache.stats.corrupt == 1 and cache.stats.misses == 2


def test_vanished_file_reads_as_miss(tmp_path: Path) -> None:
    cache = opened(tmp_path)
    digest = put(cache, b"abc")
    cache.path(digest).unlink()
    assert cache.get(digest) is None
    assert not cache.contains(digest) and cache.stats.corrupt == 0 and cache.used_bytes == 0


def test_budget_counts_allocated_blocks(tmp_path: Path) -> None:
    cache = opened(tmp_path, budget=10 * 64 * KiB)
    digest = put(cache, b"x")  # one byte still allocates a whole block
    assert cache.used_bytes == os.stat(cache.path(digest)).st_blocks * 512 >= 4096
    for _ in range(1, 40):
        put(cache, os.urandom(64 * KiB))
        assert cache.used_bytes <= cache.budget_bytes
        assert allocated_bytes(tmp_path) == cache.used_bytes
    assert cache.stats.evictions == 40 - 10 and cache.stats.evicted_bytes > 29 * 64 * KiB


def test_lru_per_chunk(tmp_path: Path, clock: FakeClock) -> None:
    size = 64 * KiB
    cache = opened(tmp_path, budget=4 * size, clock=clock)
    blobs = [os.urandom(size) for _ in range(6)]
    for blob in blobs[:4]:
        clock.advance(TICK_S)
        put(cache, blob)
    clock.advance(TICK_S)
    assert cache.get(sha(blobs[0])) is not None  # the oldest chunk is now the most recently used
    assert cache.digests() == [sha(b) for b in (blobs[1], blobs[2], blobs[3], blobs[0])]
    clock.advance(TICK_S)
    put(cache, blobs[4])  # evicts the least recently used chunk
    assert not cache.contains(sha(blobs[1])) and not cache.path(sha(blobs[1])).exists()
    clock.advance(TICK_S)
    put(cache, blobs[5])
    assert cache.digests() == [sha(b) for b in (blobs[3], blobs[0], blobs[4], blobs[5])]
    assert cache.stats.evictions == 2 and cache.used_bytes <= cache.budget_bytes


def test_a_put_never_evicts_its_own_chunk(tmp_path: Path) -> None:
    cache = opened(tmp_path, budget=100 * KiB)
    small = put(cache, os.urandom(60 * KiB))
    big = put(cache, os.urandom(200 * KiB))  # alone it is over budget: everything else goes, it stays
    assert cache.digests() == [big] and not cache.contains(small)
    assert cache.used_bytes > cache.budget_bytes


def test_index_and_lru_survive_a_new_cache_over_the_same_root(tmp_path: Path, clock: FakeClock) -> None:
    size = 64 * KiB
    first = opened(tmp_path, budget=6 * size, clock=clock, touch_interval_s=50)
    blobs = [chunk_data(n, i)[:size] for n in (1, 2) for i in range(3)]
    for blob in blobs:
        clock.advance(TICK_S)
        put(first, blob)
    clock.advance(TICK_S)
    first.get(sha(blobs[0]))  # a hit mirrors the use into the mtime
    used = first.used_bytes

    second = opened(tmp_path, budget=6 * size, clock=clock)
    assert second.used_bytes == used == allocated_bytes(tmp_path)
    assert second.digests() == [sha(b) for b in blobs[1:] + blobs[:1]]
    for blob in blobs:
        assert second.path(sha(blob)).read_bytes() == blob
    clock.advance(TICK_S)
    put(second, os.urandom(size))  # the LRU order rebuilt from disk picks the victim
    assert not second.contains(sha(blobs[1]))

    third = opened(tmp_path, budget=2 * size, clock=clock)  # a smaller budget is enforced on open
    assert third.used_bytes <= 2 * size and third.digests()[0] == sha(blobs[0])


def test_open_removes_leftover_temp_files_and_the_earlier_layout(tmp_path: Path) -> None:
    digest = put(opened(tmp_path), b"kept")
    fan = tmp_path / digest[:2]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    other = sha(b"other")
    leftovers = [f".{digest}.tmp.{dead.stdout.strip()}.ab12", f".{other}.tmp.{os.getpid()}.cd34"]
    leftovers.append(f".{other}.tmp.0.ef56")
    for name in leftovers:
        (fan / name).write_bytes(b"half a chunk")
    live_temp = f".{other}.tmp.1.0a0a"
    (fan / live_temp).write_bytes(b"a live process (pid 1) may still rename this")
    (fan / "notes.txt").write_bytes(b"not ours")
    legacy = tmp_path / ("ab" * 16)  # <identity>/<idx>: chunks keyed by image, before content addressing
    legacy.mkdir()
    (legacy / "00000003").write_bytes(b"an old chunk")
    (tmp_path / "objects").mkdir()  # the memory server's kept indexes: not the cache's
    (tmp_path / "objects" / "x").write_bytes(b"index")

    cache = opened(tmp_path)
    assert sorted(os.listdir(fan)) == sorted([digest, live_temp, "notes.txt"])
    assert not legacy.exists() and (tmp_path / "objects" / "x").exists()
    assert cache.digests() == [digest]
    assert cache.used_bytes == allocated_bytes(fan / digest)


def test_misuse_is_refused(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path, 1 << 20)
    with pytest.raises(StateError):
        cache.get("0" * 64)
    with pytest.raises(StateError):
        cache.put("0" * 64, b"x")
    cache.open()
    for digest in ("../etc", "A" * 64, "0" * 63, ""):
        with pytest.raises(InvalidArgument):
            cache.put(digest, b"x")
        with pytest.raises(InvalidArgument):
            cache.get(digest)
    with pytest.raises(InvalidArgument):
        ChunkCache(tmp_path, -1)


def test_concurrent_puts_and_gets_keep_exact_accounting(tmp_path: Path) -> None:
    cache = opened(tmp_path, budget=2 * MiB)
    blobs = [chunk_data(n, i) for n in (1, 2, 3) for i in range(8)]
    wrong: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            data = rng.choice(blobs)
            if rng.random() < 0.5:
                cache.put(sha(data), data)
            else:
                got = cache.get(sha(data))
                if got is not None and got != data:
                    wrong.append(sha(data))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and cache.stats.corrupt == 0
    assert cache.used_bytes == allocated_bytes(tmp_path) <= cache.budget_bytes
    reopened = opened(tmp_path, budget=2 * MiB)
    assert reopened.used_bytes == cache.used_bytes
    assert sorted(p.name for p in tmp_path.glob("*/*")) == sorted(cache.digests())


# -- kill -9 during PutDurable ------------------------------------------------------------------------------

ZYGOTE = """
import os, random, sys, threading, hashlib
from pathlib import Path
from cryobox.agent.memory.server.chunkcache import ChunkCache

{chunk_data}

root, budget, images, mutant = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "mutant"
DATA = {{(i, n): chunk_data(i, n) for i in range(images) for n in range({chunks})}}
SHA = {{key: hashlib.sha256(data).hexdigest() for key, data in DATA.items()}}

def write_in_place(self, path, data, now):
    # the classic mistake: write the final name directly (no temp file, no rename)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
        return os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)

if mutant:
    assert hasattr(ChunkCache, "_write_durable")
    ChunkCache._write_durable = write_in_place

def run(seed):
    # put (and read back) random chunks on 3 threads until killed; wrong bytes from get() -> exit 5
    cache = ChunkCache(root, budget)
    cache.open()
    def loop(rng):
        keys = sorted(DATA)
        while True:
            key = rng.choice(keys)
            if rng.random() < 0.8:
                cache.put(SHA[key], DATA[key])
            elif cache.get(SHA[key]) not in (None, DATA[key]):
                os._exit(5)
    for n in range(3):
        threading.Thread(target=loop, args=(random.Random(seed * 10 + n),), daemon=True).start()
    threading.Event().wait(30)
    os._exit(3)  # never killed: the parent is gone

print("ready", flush=True)
for line in sys.stdin:  # one line per child: its seed
    pid = os.fork()
    if pid == 0:
        try:
            run(int(line))
        finally:
            os._exit(4)
    print("pid", pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(status), flush=True)
"""

KILL_ROUNDS = 30
KILL_IMAGES = 3
KILL_CHUNKS = 8
KILL_BUDGET = 6 * MiB  # below the ~9 MiB of all chunks: eviction runs (and gets killed) too


@contextmanager
def zygote(root: Path, script: Path, *, mutant: bool = False) -> Iterator[subprocess.Popen[str]]:
    """A tiny script that imports the cache once, then forks one putting child per request (fast to start)."""
    script.write_text(ZYGOTE.format(chunk_data=textwrap.dedent(inspect.getsource(chunk_data)), chunks=KILL_CHUNKS))
    argv = [sys.executable, str(script), str(root), str(KILL_BUDGET), str(KILL_IMAGES), "mutant" if mutant else "real"]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            yield proc
        finally:
            proc.kill()


@dataclass
class KillReport:
    rounds: int = 0
    present: int = 0  # chunks found present after the kills (summed over rounds)
    temps: int = 0  # temp files the kills left behind (a kill landed inside a put)
    wrong: list[tuple[int, str]] = field(default_factory=list)  # (round, sha256) present with wrong bytes
    corrupt: int = 0  # get() calls that found a present chunk's bytes not matching
    accounting: list[tuple[int, int, int]] = field(default_factory=list)  # (round, used_bytes, allocated) if unequal


def kill_rounds(proc: subprocess.Popen[str], root: Path, rounds: int, *, stop_at_wrong: bool = False) -> KillReport:
    """Start a putting child, SIGKILL it after a random delay, reopen the cache and check every present chunk."""
    assert proc.stdin is not None and proc.stdout is not None
    rng = random.Random(5)
    expected = {sha(data): data for data in (chunk_data(n, i) for n in range(KILL_IMAGES) for i in range(KILL_CHUNKS))}
    report = KillReport()
    for round_ in range(rounds):
        proc.stdin.write(f"{round_}\n")
        proc.stdin.flush()
        words = proc.stdout.readline().split()
        assert words[0] == "pid", words
        threading.Event().wait(rng.uniform(0.005, 0.06))
        os.kill(int(words[1]), signal.SIGKILL)
        assert proc.stdout.readline().split() == ["status", str(-signal.SIGKILL)]  # killed, not crashed
        report.rounds += 1

        report.temps += len(list(root.glob("*/.*.tmp.*")))
        cache = opened(root, budget=KILL_BUDGET)
        assert list(root.glob("*/.*.tmp.*")) == []
        for digest, data in expected.items():
            if not cache.contains(digest):
                assert not cache.path(digest).exists()
                continue
            report.present += 1
            if cache.path(digest).read_bytes() != data or cache.get(digest) != data:
                report.wrong.append((round_, digest))
        report.corrupt += cache.stats.corrupt
        if cache.used_bytes != allocated_bytes(root):
            report.accounting.append((round_, cache.used_bytes, allocated_bytes(root)))
        if report.wrong and stop_at_wrong:
            break
    return report


@pytest.mark.timeout(120)
def test_kill_9_during_put_durable_never_leaves_wrong_bytes(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with zygote(root, tmp_path / "zygote.py") as proc:
        report = kill_rounds(proc, root, KILL_ROUNDS)
    assert report.wrong == [], f"chunks present with wrong bytes after kill -9: {report.wrong}"
    assert report.corrupt == 0 and report.accounting == []
    assert report.rounds == KILL_ROUNDS
    assert report.present > KILL_ROUNDS  # the children really stored chunks
    assert report.temps > 0  # and some kills really landed in the middle of a put


@pytest.mark.timeout(120)
def test_kill_9_harness_catches_a_put_that_writes_the_final_name_in_place(tmp_path: Path) -> None:
    """The same harness against a broken PutDurable (no temp file + rename) must find torn chunks."""
    root = tmp_path / "cache"
    with zygote(root, tmp_path / "zygote.py", mutant=True) as proc:
        report = kill_rounds(proc, root, KILL_ROUNDS, stop_at_wrong=True)
    assert report.wrong, f"{report.rounds} kills of a non-atomic put went unnoticed"
