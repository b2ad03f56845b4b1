"""ChunkCache: PutDurable under kill -9, verification on read, allocated-bytes budget, LRU by generation, restart."""

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

from cryobox.agent.store.chunkcache import ChunkCache, cache_identity
from cryobox.errors import InvalidArgument, StateError
from cryobox.util.files import allocated_bytes

KiB = 1 << 10
MiB = 1 << 20


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 100.0) -> float:
        self.now += seconds
        return self.now


def ident(n: int) -> str:
    return cache_identity("s3://bucket?endpoint=http://127.0.0.1:9000", f"templates/t{n}/memory.pack", f"gen{n}")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunk_data(identity: str, idx: int) -> bytes:
    """The one content chunk ``idx`` of ``identity`` ever has in these tests (1 byte .. 768 KiB)."""
    rng = random.Random(f"{identity}/{idx}")
    return rng.randbytes(rng.randrange(1, 768 * 1024))


@pytest.fixture
def clock() -> Clock:
    return Clock()


def opened(root: Path, budget: int = 1 << 40, clock: Clock | None = None, **kw: float) -> ChunkCache:
    cache = ChunkCache(root, budget, clock or Clock(), **kw)
    cache.open()
    return cache


def test_cache_identity() -> None:
    a = cache_identity("s3://b", "k/memory.pack", "g1")
    assert len(a) == 32 and int(a, 16) >= 0 and a == cache_identity("s3://b", "k/memory.pack", "g1")
    assert len({a, cache_identity("s3://c", "k/memory.pack", "g1"), cache_identity("s3://b", "k", "g1")}) == 3
    assert cache_identity("s3://b", "k/memory.pack", "g2") != a
    assert cache_identity("a/b", "c", "g") != cache_identity("a", "b/c", "g")  # no ambiguity at the joins


def test_put_get_contains_and_layout(tmp_path: Path) -> None:
    cache = opened(tmp_path / "cache")
    data = os.urandom(100 * KiB)
    assert cache.get(ident(1), 3, sha(data)) is None and not cache.contains(ident(1), 3)
    cache.put(ident(1), 3, data)
    assert cache.contains(ident(1), 3) and not cache.contains(ident(2), 3)
    assert cache.get(ident(1), 3, sha(data)) == data
    assert (tmp_path / "cache" / ident(1) / "00000003").read_bytes() == data
    assert cache.path(ident(1), 3) == tmp_path / "cache" / ident(1) / "00000003"
    assert os.listdir(tmp_path / "cache" / ident(1)) == ["00000003"]  # no temp file left behind
    cache.put(ident(1), 3, data)  # putting again replaces, accounting stays exact
    assert cache.used_bytes == allocated_bytes(tmp_path / "cache")
    s = cache.stats
    assert (s.hits, s.misses, s.puts, s.corrupt, s.evictions) == (1, 1, 2, 0, 0)


def test_corrupt_file_reads_as_miss_and_is_deleted(tmp_path: Path) -> None:
    cache = opened(tmp_path)
    data = os.urandom(64 * KiB)
    cache.put(ident(1), 0, data)
    path = cache.path(ident(1), 0)
    raw = bytearray(path.read_bytes())
    raw[1234] ^= 0x01
    path.write_bytes(bytes(raw))
    assert cache.get(ident(1), 0, sha(data)) is None
    assert not path.exists() and not cache.contains(ident(1), 0)
    assert cache.stats.corrupt == 1 and cache.used_bytes == 0
    assert cache.get(ident(1), 0, sha(data)) is None  # now simply absent
    assert cache.stats.corrupt == 1 and cache.stats.misses == 2


def test_vanished_file_reads_as_miss(tmp_path: Path) -> None:
    cache = opened(tmp_path)
    cache.put(ident(1), 0, b"abc")
    cache.path(ident(1), 0).unlink()
    assert cache.get(ident(1), 0, sha(b"abc")) is None
    assert not cache.contains(ident(1), 0) and cache.stats.corrupt == 0 and cache.used_bytes == 0


def test_budget_counts_allocated_blocks(tmp_path: Path) -> None:
    cache = opened(tmp_path, budget=10 * 64 * KiB)
    cache.put(ident(1), 0, b"x")  # one byte still allocates a whole block
    assert cache.used_bytes == os.stat(cache.path(ident(1), 0)).st_blocks * 512 >= 4096
    for idx in range(1, 40):
        cache.put(ident(1 + idx % 3), idx, os.urandom(64 * KiB))
        assert cache.used_bytes <= cache.budget_bytes
        assert allocated_bytes(tmp_path) == cache.used_bytes
    assert cache.stats.evictions == 40 - 10 and cache.stats.evicted_bytes > 29 * 64 * KiB


def test_lru_by_generation(tmp_path: Path, clock: Clock) -> None:
    size = 64 * KiB
    cache = opened(tmp_path, budget=9 * size, clock=clock)
    blobs = {(n, i): os.urandom(size) for n in (1, 2, 3, 4) for i in range(3)}
    for n in (1, 2, 3):  # generations 1, 2, 3 written in that order
        for i in range(3):
            clock.tick()
            cache.put(ident(n), i, blobs[n, i])
    clock.tick()
    assert cache.get(ident(1), 1, sha(blobs[1, 1])) is not None  # generation 1 is now the most recently used
    assert cache.chunks(ident(1)) == [0, 2, 1]
    assert cache.identities() == [ident(2), ident(3), ident(1)]
    assert cache.used_bytes == 9 * size

    clock.tick()
    cache.put(ident(4), 0, blobs[4, 0])  # evicts from generation 2 (least recently used), oldest chunk first
    assert cache.chunks(ident(2)) == [1, 2]
    clock.tick()
    cache.put(ident(4), 1, blobs[4, 1])
    clock.tick()
    cache.put(ident(4), 2, blobs[4, 2])
    assert cache.chunks(ident(2)) == [] and not (tmp_path / ident(2)).exists()  # whole generation gone first
    assert cache.chunks(ident(3)) == [0, 1, 2] and cache.chunks(ident(1)) == [0, 2, 1]
    clock.tick()
    cache.put(ident(4), 3, os.urandom(size))
    assert cache.chunks(ident(3)) == [1, 2]  # then the next least recently used generation
    assert cache.stats.evictions == 4 and cache.used_bytes <= cache.budget_bytes


def test_a_put_never_evicts_its_own_chunk(tmp_path: Path) -> None:
    cache = opened(tmp_path, budget=100 * KiB)
    cache.put(ident(1), 0, os.urandom(60 * KiB))
    cache.put(ident(2), 0, os.urandom(200 * KiB))  # alone it is over budget: everything else goes, it stays
    assert cache.chunks(ident(1)) == [] and cache.chunks(ident(2)) == [0]
    assert cache.used_bytes > cache.budget_bytes


def test_index_and_lru_survive_a_new_cache_over_the_same_root(tmp_path: Path, clock: Clock) -> None:
    size = 64 * KiB
    first = opened(tmp_path, budget=6 * size, clock=clock, touch_interval_s=50)
    for n in (1, 2):
        for i in range(3):
            clock.tick()
            first.put(ident(n), i, chunk_data(ident(n), i)[:size])
    clock.tick()
    first.get(ident(1), 0, sha(chunk_data(ident(1), 0)[:size]))  # a hit mirrors the use into the mtime
    used = first.used_bytes

    second = opened(tmp_path, budget=6 * size, clock=clock)
    assert second.used_bytes == used == allocated_bytes(tmp_path)
    assert second.identities() == [ident(2), ident(1)]
    assert second.chunks(ident(1)) == [1, 2, 0] and second.chunks(ident(2)) == [0, 1, 2]
    for n in (1, 2):
        for i in range(3):
            assert second.path(ident(n), i).read_bytes() == chunk_data(ident(n), i)[:size]
    clock.tick()
    second.put(ident(3), 0, os.urandom(size))  # the LRU order rebuilt from disk picks the victim
    assert second.chunks(ident(2)) == [1, 2]

    third = opened(tmp_path, budget=2 * size, clock=clock)  # a smaller budget is enforced on open
    assert third.used_bytes <= 2 * size and third.identities()[-1] == ident(3)


def test_open_removes_leftover_temp_files_and_empty_dirs(tmp_path: Path) -> None:
    opened(tmp_path).put(ident(1), 7, b"kept")
    gen_dir = tmp_path / ident(1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftovers = [f".7.tmp.{dead.stdout.strip()}.ab12", f".8.tmp.{os.getpid()}.cd34", ".9.tmp.0.ef56"]
    for name in leftovers:
        (gen_dir / name).write_bytes(b"half a chunk")
    (gen_dir / ".3.tmp.1.0a0a").write_bytes(b"a live process (pid 1) may still rename this")
    (gen_dir / "notes.txt").write_bytes(b"not ours")
    (tmp_path / ident(2)).mkdir()  # an empty generation directory
    (tmp_path / "lost+found").mkdir()

    cache = opened(tmp_path)
    assert sorted(os.listdir(gen_dir)) == sorted(["00000007", ".3.tmp.1.0a0a", "notes.txt"])
    assert not (tmp_path / ident(2)).exists() and (tmp_path / "lost+found").is_dir()
    assert cache.identities() == [ident(1)] and cache.chunks(ident(1)) == [7]
    assert cache.used_bytes == allocated_bytes(gen_dir / "00000007")


def test_misuse_is_refused(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path, 1 << 20)
    with pytest.raises(StateError):
        cache.get(ident(1), 0, "0" * 64)
    with pytest.raises(StateError):
        cache.put(ident(1), 0, b"x")
    cache.open()
    for identity, idx in (("../etc", 0), ("A" * 32, 0), (ident(1), -1)):
        with pytest.raises(InvalidArgument):
            cache.put(identity, idx, b"x")
    with pytest.raises(InvalidArgument):
        cache.get(ident(1), 0, "")
    with pytest.raises(InvalidArgument):
        ChunkCache(tmp_path, -1)


def test_discard_drops_a_generation(tmp_path: Path) -> None:
    cache = opened(tmp_path)
    for i in range(3):
        cache.put(ident(1), i, os.urandom(10 * KiB))
    cache.put(ident(2), 0, b"stays")
    size = sum(allocated_bytes(cache.path(ident(1), i)) for i in range(3))
    assert cache.discard(ident(1)) == size > 0
    assert cache.identities() == [ident(2)] and not (tmp_path / ident(1)).exists()


def test_concurrent_puts_and_gets_keep_exact_accounting(tmp_path: Path) -> None:
    cache = opened(tmp_path, budget=2 * MiB)
    keys = [(ident(n), i) for n in (1, 2, 3) for i in range(8)]
    wrong: list[tuple[str, int]] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            identity, idx = rng.choice(keys)
            data = chunk_data(identity, idx)
            if rng.random() < 0.5:
                cache.put(identity, idx, data)
            else:
                got = cache.get(identity, idx, sha(data))
                if got is not None and got != data:
                    wrong.append((identity, idx))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and cache.stats.corrupt == 0
    assert cache.used_bytes == allocated_bytes(tmp_path) <= cache.budget_bytes
    reopened = opened(tmp_path, budget=2 * MiB)
    assert reopened.used_bytes == cache.used_bytes
    files = sorted((p.parent.name, int(p.name)) for p in tmp_path.glob("*/*"))
    assert files == sorted((n, i) for n in cache.identities() for i in cache.chunks(n))


# -- kill -9 during PutDurable ------------------------------------------------------------------------------

ZYGOTE = """
import os, random, sys, threading, hashlib
from pathlib import Path
from cryobox.agent.store.chunkcache import ChunkCache, cache_identity

{chunk_data}

root, budget, identities, mutant = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4] == "mutant"
DATA = {{(i, n): chunk_data(i, n) for i in identities for n in range({chunks})}}
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
                cache.put(*key, DATA[key])
            elif cache.get(*key, SHA[key]) not in (None, DATA[key]):
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
KILL_GENERATIONS = 3
KILL_CHUNKS = 8
KILL_BUDGET = 6 * MiB  # below the ~9 MiB of all chunks: eviction runs (and gets killed) too


@contextmanager
def zygote(root: Path, script: Path, *, mutant: bool = False) -> Iterator[subprocess.Popen[str]]:
    """A tiny script that imports the cache once, then forks one putting child per request (fast to start)."""
    script.write_text(ZYGOTE.format(chunk_data=textwrap.dedent(inspect.getsource(chunk_data)), chunks=KILL_CHUNKS))
    identities = ",".join(ident(n) for n in range(KILL_GENERATIONS))
    argv = [sys.executable, str(script), str(root), str(KILL_BUDGET), identities, "mutant" if mutant else "real"]
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
    wrong: list[tuple[int, str, int]] = field(default_factory=list)  # (round, identity, idx) present with wrong bytes
    corrupt: int = 0  # get() calls that found a present chunk's bytes not matching
    accounting: list[tuple[int, int, int]] = field(default_factory=list)  # (round, used_bytes, allocated) if unequal


def kill_rounds(proc: subprocess.Popen[str], root: Path, rounds: int, *, stop_at_wrong: bool = False) -> KillReport:
    """Start a putting child, SIGKILL it after a random delay, reopen the cache and check every present chunk."""
    assert proc.stdin is not None and proc.stdout is not None
    rng = random.Random(5)
    expected = {(ident(n), i): chunk_data(ident(n), i) for n in range(KILL_GENERATIONS) for i in range(KILL_CHUNKS)}
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
        for (identity, idx), data in expected.items():
            if not cache.contains(identity, idx):
                assert not cache.path(identity, idx).exists()
                continue
            report.present += 1
            if cache.path(identity, idx).read_bytes() != data or cache.get(identity, idx, sha(data)) != data:
                report.wrong.append((round_, identity, idx))
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
