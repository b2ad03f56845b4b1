"""``cryobox bisect`` and ``cryobox debug`` (with ``--shell`` over the pty websocket) against a real server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cryobox import Sandbox, Snapshots
from cryobox.bench.server import ServeProcess
from cryobox.errors import NotFound
from tests.support.serve import Api

# Fails half the time, on a byte drawn from the kernel's CSPRNG when it runs (as random.SystemRandom would draw it;
# a shell script, because 16 python3 start-ups at once cost ~13 s under TCG).
FLAKY = """\
byte=$(od -An -N1 -tu1 /dev/urandom)
exit $(( byte < 128 ))
"""

# Draws once, keeps the answer only in memory; SIGUSR1 makes it write the answer to /tmp/answer.
HOLDER = """\
import os, random, signal
answer = "pass" if random.SystemRandom().random() < 0.5 else "fail"

def tell(signum, frame):
    with open("/tmp/answer.tmp", "w") as handle:
        handle.write(answer)
    os.replace("/tmp/answer.tmp", "/tmp/answer")

signal.signal(signal.SIGUSR1, tell)
with open("/tmp/pid.tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace("/tmp/pid.tmp", "/tmp/pid")
while True:
    signal.pause()
"""

ASK_HOLDER = (
    "kill -USR1 $(cat /tmp/pid); "
    "for i in $(seq 100); do test -s /tmp/answer && break; sleep 0.1; done; "
    'test "$(cat /tmp/answer)" = pass'
)

# Blocks forever in read(2) on a pipe whose write end it holds itself.
HANGER = (
    "import os; r, w = os.pipe(); "
    "open('/tmp/hang.tmp', 'w').write(str(os.getpid())); os.replace('/tmp/hang.tmp', '/tmp/hang.pid'); "
    "os.read(r, 1)"
)


def cryobox(server: ServeProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cryobox.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **server.env(), "COLUMNS": "200"},
        input=stdin if stdin is not None else "",
        timeout=240,
    )


def wait_for_file(sbx: Sandbox, path: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = sbx.exec(f"cat {path}", timeout_seconds=30)
        if result.exit_code == 0 and result.stdout.strip():
            return result.stdout.strip()
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear in {sbx.id}")


def gone(sandbox_id: str, server: ServeProcess) -> bool:
    """The sandbox was killed (its record may still be listed as stopped)."""
    try:
        sbx = Sandbox.connect(sandbox_id, api_url=server.url, api_key=server.api_key)
    except NotFound:
        return True
    sbx.close()
    return sbx.info.status == "stopped"


def bisect_json(server: ServeProcess, target: str, count: int, *command: str) -> dict[str, Any]:
    done = cryobox(server, "bisect", target, "--count", str(count), "--timeout", "120", "--json", "--", *command)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["count"] == len(report["children"])
    assert report["count"] + len(report["create_errors"]) + len(report["failed_children"]) == count
    assert report["count"] >= count * 3 // 4, report  # a few children may fail to be created on a loaded host
    return report


def test_bisect_before_and_after_the_draw(server: ServeProcess, sandbox: Sandbox) -> None:
    sandbox.filesystem.write("/root/flaky.sh", FLAKY)
    sandbox.filesystem.write("/root/holder.py", HOLDER)

    # Before the draw: every child draws on its own (fresh entropy per restore), so the children disagree.
    started = time.monotonic()
    before = bisect_json(server, sandbox.id, 16, "sh", "/root/flaky.sh")  # all agree by chance: 2 in 65536
    before_s = time.monotonic() - started
    assert 0 < before["reproduced"] < before["count"], before
    assert all(c["exit_code"] in (0, 1) for c in before["children"])

    # After the draw: the answer lives in one process's memory, copied into every child: they all agree, on the
    # parent's answer (checked below); that holds for any number of children, so 8 are enough.
    sandbox.exec("setsid python3 /root/holder.py </dev/null >/dev/null 2>&1 &", timeout_seconds=30)
    wait_for_file(sandbox, "/tmp/pid")
    assert sandbox.exec("test -e /tmp/answer").exit_code == 1  # nothing on disk yet
    after = bisect_json(server, sandbox.id, 8, ASK_HOLDER)
    assert after["reproduced"] in (0, after["count"]), after

    # The text report and the parent: children killed, the parent untouched.
    print(f"bisect before: {before['reproduced']}/{before['count']} in {before_s:.1f} s")
    print(f"bisect after: {after['reproduced']}/{after['count']}")
    assert sandbox.exec("test -e /tmp/answer").exit_code == 1
    for child in before["children"] + after["children"]:
        assert gone(child["id"], server), child
    # every child reproduced exactly what the parent's process holds
    parent_fails = sandbox.exec(ASK_HOLDER, timeout_seconds=30).exit_code != 0
    assert after["reproduced"] == (after["count"] if parent_fails else 0), (parent_fails, after)


@pytest.fixture(scope="module")
def hung_snapshot(server: ServeProcess) -> Iterator[tuple[str, int]]:
    """A retained snapshot of a sandbox with a process stuck in a pipe read and a /failure.json about it. Shared
    by this file's debug tests: they only restore copies of it (the source sandbox is gone once it is taken)."""
    api = Api(api_url=server.url, api_key=server.api_key)
    sandbox = Sandbox.create(template="base", **api)
    try:
        sandbox.exec(f'setsid python3 -c "{HANGER}" </dev/null >/dev/null 2>&1 &', timeout_seconds=30)
        pid = int(wait_for_file(sandbox, "/tmp/hang.pid"))
        failure = {
            "commit": "0123abc",
            "seed": 1234,
            "command": "pytest tests/test_hang.py",
            "exit_code": None,
            "captured_at": "2024-01-01T00:00:00Z",
            "host": "test",
            "template": "base",
            "pid": pid,
            "kind": "hang",
        }
        sandbox.filesystem.write("/failure.json", json.dumps(failure))
        sandbox.exec("mkdir -p /work/.cryobox && seq 1 200 | sed 's/^/log line /' > /work/.cryobox/test.log")
        snap = sandbox.snapshot(retain=True)
    finally:
        sandbox.kill()  # a retained snapshot outlives its sandbox
    try:
        yield snap.id, pid
    finally:
        with Snapshots(**api) as snapshots:
            try:
                snapshots.delete(snap.id)
            except NotFound:
                pass


def test_debug_restores_independent_copies(server: ServeProcess, api: Api, hung_snapshot: tuple[str, int]) -> None:
    snap_id, pid = hung_snapshot
    kept: list[str] = []
    try:
        reports = []
        for _ in range(2):
            started = time.monotonic()
            done = cryobox(server, "debug", snap_id, "--json", "--keep")
            assert done.returncode == 0, done.stderr
            print(f"debug --json in {time.monotonic() - started:.1f} s")
            report = json.loads(done.stdout)
            kept.append(report["sandbox_id"])
            reports.append(report)
            if len(kept) == 1:  # a change in the first copy must not show in the second
                first = Sandbox.connect(report["sandbox_id"], **api)
                try:
                    first.filesystem.write("/root/marker", "first copy")
                finally:
                    first.close()
        for report in reports:
            assert report["failure"]["kind"] == "hang" and report["failure"]["pid"] == pid
            assert report["failure"]["seed"] == 1234
            stuck = report["stuck"]
            assert stuck["pid"] == pid
            assert stuck["state"].startswith("S"), stuck
            assert "pipe_read" in stuck["stack"] or "pipe_read" in (stuck["wchan"] or ""), stuck
            assert "pipe_read" in stuck["stack"], stuck["stack"]
            assert "pipe:[" in stuck["fds"]
            assert re.search(rf"^\s*{pid}\s+S", report["ps"], re.MULTILINE), report["ps"]
            assert report["log_tail"].rstrip().endswith("log line 200")
        assert kept[0] != kept[1]
        second = Sandbox.connect(kept[1], **api)
        try:
            assert not second.filesystem.exists("/root/marker")
        finally:
            second.close()
    finally:
        for sandbox_id in kept:
            try:
                Sandbox.connect(sandbox_id, **api).kill()
            except NotFound:
                pass


def test_debug_shell(server: ServeProcess, api: Api, hung_snapshot: tuple[str, int]) -> None:
    snap_id, pid = hung_snapshot
    started = time.monotonic()
    done = cryobox(server, "debug", snap_id, "--shell", stdin="echo hello-from-pty; echo tty=$(tty); exit\n")
    print(f"debug --shell in {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.replace("\r", "\n").splitlines()]
    assert "hello-from-pty" in lines, done.stdout  # the command's output, not only the echo of the input
    assert any(line.startswith("tty=/dev/pts/") for line in lines), done.stdout
    assert f"kernel stack of {pid}" in done.stdout  # the text report came first
    restored = re.search(r"restored \S+ into (\S+)", done.stdout)
    assert restored is not None
    assert gone(restored.group(1), server)  # not --keep: the copy is gone
