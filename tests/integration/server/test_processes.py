"""Background processes and directory watches through cryobox's own SDK, against real VMs: start, list,
reattach with the buffered output replayed, stdin, signal, wait; a watch sees changes; and a background process
keeps running across a snapshot, in the restore and in every fork child, with its output log."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from cryobox import NotFound, Sandbox
from cryobox.bench.server import ServeProcess


@pytest.fixture
def sbx(server: ServeProcess) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template="base", api_url=server.url, api_key=server.api_key)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_background_processes(sbx: Sandbox) -> None:
    # a fresh sandbox lists no process: its pool VM's warm-up ran a login shell (agent/sandbox/poolwarm.py)
    # that the guest forgot when it ended
    assert sbx.processes.list() == []
    ticker = sbx.exec("for i in $(seq 1 5); do echo tick$i; sleep 0.2; done; echo err >&2; exit 4", background=True)
    assert ticker.pid > 1
    waited = ticker.wait(timeout_seconds=60)
    assert (waited.exit_code, waited.stdout, waited.stderr) == (4, "".join(f"tick{i}\n" for i in range(1, 6)), "err\n")
    assert waited.status == "exit status 4"
    replay = sbx.processes.connect(ticker.pid)  # ended, still remembered: its whole output again
    events = list(replay.stream())
    assert "".join(e.chunk or "" for e in events if e.kind == "stdout") == waited.stdout
    assert events[-1].kind == "exit" and events[-1].exit_code == 4

    cat = sbx.processes.start("cat; echo closed", stdin=True, tag="reader")
    cat.send_stdin("line one\n")
    cat.send_stdin(b"line two\n")
    cat.close_stdin()
    assert cat.wait(timeout_seconds=60).stdout == "line one\nline two\nclosed\n"

    sleeper = sbx.processes.start("sleep 600")
    assert sleeper.pid in {p.pid for p in sbx.processes.list() if p.running}
    assert sbx.exec(f"kill -0 {sleeper.pid} && echo alive").stdout == "alive\n"  # a real guest process
    sleeper.signal("TERM")
    ended = sleeper.wait(timeout_seconds=60)
    assert ended.status == "signal: terminated" and ended.exit_code == -1
    assert sbx.exec(f"kill -0 {sleeper.pid} 2>/dev/null || echo gone").stdout == "gone\n"
    with pytest.raises(NotFound):
        sbx.processes.connect(999_999)


def test_watch_sees_changes(sbx: Sandbox) -> None:
    sbx.exec("mkdir -p /work/watched/sub")
    seen: list[tuple[str, str]] = []
    with contextlib.closing(sbx.filesystem.watch("/work/watched", recursive=True)) as events:
        for event in events:
            if event.kind == "start":
                sbx.exec("echo a > /work/watched/sub/new.txt; rm /work/watched/sub/new.txt")
                continue
            seen.append((event.kind, event.name))
            if event.kind == "remove":
                break
    assert ("create", "sub/new.txt") in seen and ("remove", "sub/new.txt") in seen, seen


def test_a_background_process_lives_on_in_snapshots_restores_and_fork_children(
    server: ServeProcess, sbx: Sandbox
) -> None:
    counter = sbx.processes.start("i=0; while true; do i=$((i+1)); echo n$i; sleep 0.3; done", tag="counter")
    time.sleep(1.0)
    snapshot = sbx.snapshot()
    restored = Sandbox.create(from_snapshot=snapshot.id, api_url=server.url, api_key=server.api_key)
    tree = sbx.fork_tree(2)
    try:
        assert not tree.errors
        for child in [restored, *tree.children]:
            procs = {p.pid: p for p in child.processes.list()}
            assert counter.pid in procs and procs[counter.pid].running and procs[counter.pid].tag == "counter"
            stream = child.processes.connect(counter.pid).stream()
            lines: list[str] = []
            for event in stream:  # the log from before the snapshot, then lines printed in the child
                lines += [line for line in (event.chunk or "").splitlines() if line]
                if len(lines) >= 12:
                    break
            stream.close()
            assert lines[0] == "n1" and lines[:12] == [f"n{i}" for i in range(1, 13)], (child.id, lines)
        assert counter.pid in {p.pid for p in sbx.processes.list() if p.running}  # the parent's too
    finally:
        restored.kill()
        for child in tree.children:
            child.kill()
